"""The one interface commands reach their state through: this machine's own
(`client_local.LocalClient`, the library called directly) or a team server's
(`client_server.ServerClient`, the /api/v1 routes of `server/paths.py`). A command gets one with
`connect.client()` and calls it the same way in both places, so it has one code path, and
tests/integration/test_cli_parity.py runs every command both ways. (The commands that set up
this machine itself, `pool add|up|down|remove|use`, `ssh`, `exec`, `dashboard`, open its store
directly; that test's NOT_CASES names them.)

Methods are named for what a command asks. Most return data the command prints; `run`, `resume`,
`logs` and `stop` carry out the whole exchange (a quote and a confirmation on this machine, the
server's answer there) because what is asked differs by place, and print as the command would.
Nothing heavy is imported here: `list` through either client stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Launched:
    """A launched cluster: its `list --json` row when asked for (`as_json`), and the words
    that say where it is (`placed`: its nodes and network here, the server's URL there)."""

    name: str
    gpu: str
    count: int
    placed: str
    row: dict[str, Any] | None


@dataclass(frozen=True)
class JobInput:
    """A job as the command line gave it: read into a spec here, sent as data to a server."""

    file: Path | None
    script: str | None
    args: list[str]
    env: list[str]
    flags: dict[str, Any]
    inline: dict[str, Any]
    cluster: str | None


class FleetClient(Protocol):
    poll_s: float  # how often a live view asks again (a server is asked less often)

    def refuse_here_only(self, command: str) -> None:
        """Refuse a command that works on this machine's own clusters (doctor --cluster, bench)
        when this CLI works through a server; nothing here."""

    def launch(self, spec: dict[str, Any], yes: bool, as_json: bool,
               cpu_slots: int | None) -> Launched: ...

    def clusters(self, every: bool) -> list[dict[str, Any]]:
        """`list`'s rows: running clusters (`every`: stopped ones too)."""

    def stop(self, name: str | None, every: bool, yes: bool) -> None:
        """Stop a job, or a cluster, by name (or every cluster), saying what ended."""

    def run(self, job: JobInput, queue: bool, cpu_slots: int | None, detach: bool,
            dry_run: bool, yes: bool) -> None:
        """Start or queue a job; then follow it to its end unless `detach`."""

    def resume(self, name: str, yes: bool, cpu_slots: int | None, detach: bool) -> None: ...

    def job(self, name: str) -> dict[str, Any]:
        """A job's detail, or its queue row (with "queued") while it has no record."""

    def logs(self, name: str, follow: bool, rank: int | None) -> str:
        """Print a job's log (with `follow`: until it ended); the job's status."""

    def jobs(self, every: bool, user: str | None) -> list[dict[str, Any]]: ...

    def cancel(self, name: str) -> None: ...

    def hold(self, name: str) -> bool:
        """True if it was not held before."""

    def release(self, name: str) -> bool:
        """True if it was held before."""

    def usage(self, by: str, since: str) -> dict[str, Any]: ...

    def pools(self, name: str | None) -> list[dict[str, Any]]: ...

    def add_user(self, name: str, team: str | None, admin: bool) -> str:
        """The new user's token."""

    def users(self) -> list[dict[str, Any]]: ...

    def remove_user(self, name: str) -> None: ...

    def set_quota(self, team: str, gpu: str, devices: int | None) -> dict[str, Any]:
        """The team's view after the change."""

    def set_budget(self, team: str, usd: float | None, month: str | None) -> dict[str, Any]: ...

    def teams(self) -> list[dict[str, Any]]: ...

    def audit(self, since: str, user: str | None) -> list[dict[str, Any]]: ...
