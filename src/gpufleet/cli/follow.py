"""Waiting for a queued job and then following it, for `run` without -d: its place in the
queue while it waits, its log once it runs, its outcome as the exit code. The same loop reads
the local store or a server (`Source`). And the words about a queued job both places print."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import typer

from gpufleet.cli.app import err, out, print_json
from gpufleet.errors import ConflictError
from gpufleet.server import paths
from gpufleet.server.paths import at
from gpufleet.slot_words import devices_shown
from gpufleet.status import CTRL_C_EXIT, exit_code

if TYPE_CHECKING:
    from gpufleet.server.client import Client
    from gpufleet.store import QueuedJob, Store

POLL_S = 0.5


class Source(Protocol):
    def waiting(self, name: str) -> dict[str, Any] | None:
        """The queue row while the job has no job record yet; None once it started."""

    def log(self, name: str, offset: int) -> dict[str, Any]:
        """{"text", "offset", "more", "active", "status"} from `offset` of the job's log."""

    def cancel(self, name: str) -> None: ...

    def stop(self, name: str) -> None: ...


class LocalSource:
    def __init__(self, store: Store):
        self.store = store

    def waiting(self, name: str) -> dict[str, Any] | None:
        from gpufleet.lifecycle import jobs, listing, queued

        if jobs.get_or_none(self.store, name) is not None:
            return None
        e = queued.entry(self.store, name)
        return listing.queued_row(e) if e is not None else None

    def log(self, name: str, offset: int) -> dict[str, Any]:
        from gpufleet.lifecycle import jobs, reconcile

        j = reconcile.refresh(self.store, name)
        path = Path(j.job_dir) / "job.log"
        text = b""
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                text = f.read(1 << 20)
        size = path.stat().st_size if path.exists() else 0
        return {"text": text.decode("utf-8", "replace"), "offset": offset + len(text),
                "more": offset + len(text) < size, "active": j.status in jobs.ACTIVE,
                "status": j.status, "reason": j.reason}

    def cancel(self, name: str) -> None:
        from gpufleet.lifecycle import accounts, queued

        queued.cancel(self.store, name, accounts.local_identity(self.store))

    def stop(self, name: str) -> None:
        from gpufleet.lifecycle import jobs, runs

        runs.stop_job(self.store, jobs.get(self.store, name))


class RemoteSource:
    def __init__(self, client: Client):
        self.client = client

    def waiting(self, name: str) -> dict[str, Any] | None:
        got = self.client.call("GET", at(paths.JOB, name))
        return got if got.get("queued") else None

    def log(self, name: str, offset: int) -> dict[str, Any]:
        got: dict[str, Any] = self.client.call("GET", at(paths.JOB_LOGS, name),
                                               query={"offset": offset})
        return got

    def cancel(self, name: str) -> None:
        self.client.call("POST", at(paths.JOB_CANCEL, name))

    def stop(self, name: str) -> None:
        self.client.call("POST", at(paths.JOB_STOP, name))


def when(t: float | None, now: float) -> str:
    """An estimated start in words: 'in about 4m' (or 'not known')."""
    if t is None:
        return "not known (what it waits for has no --time-limit)"
    left = max(0.0, t - now)
    if left < 60:
        return f"in about {left:.0f}s"
    if left < 3600:
        return f"in about {left / 60:.0f}m"
    return f"in about {left / 3600:.1f}h"


def queue_line(row: dict[str, Any], now: float) -> str:
    pos = row.get("position")
    if not pos:  # the server has not planned it yet: that takes a second
        return "queued: its place and estimated start come with the queue's next pass (a second)"
    reason = row.get("reason") or "waiting for devices"
    if row.get("wait") in ("held", "after"):  # its reason says what it waits for
        return f"queued: position {pos}; {reason}"
    est = row.get("est_start")
    start = when(est, now) if est is not None or not row.get("start_note") else row["start_note"]
    return f"queued: position {pos}, estimated start {start}; {reason}"


def _until_started(source: Source, name: str, timeout_s: float = 60.0) -> None:
    """Wait for a job the queue just claimed to get its record (it is being started)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = source.waiting(name)
        if row is None or row["status"] not in ("queued", "started"):
            return
        time.sleep(0.2)


def wait_and_follow(source: Source, name: str) -> None:
    """Until the job ends; exits 0 if it succeeded, 1 if not, 130 after Ctrl-C (which cancels
    a job still queued and stops one that runs)."""
    started = False
    try:
        said = ""
        while True:
            row = source.waiting(name)
            if row is None:
                break
            if row["status"] == "started":  # claimed by the queue, its record a moment away
                time.sleep(POLL_S)
                continue
            if row["status"] != "queued":
                err.print(f"Job {name} left the queue: {row['status']}"
                          + (f" ({row['reason']})" if row.get("reason") else ""),
                          markup=False, highlight=False)
                raise typer.Exit(exit_code(row["status"]))
            line = queue_line(row, time.time())
            if line.split(", estimated")[0] + (row.get("reason") or "") != said:
                said = line.split(", estimated")[0] + (row.get("reason") or "")
                err.print(line, markup=False, highlight=False, soft_wrap=True)
            time.sleep(POLL_S)
        started = True
        err.print(f"Job {name} started.", highlight=False)
        offset, last = 0, {}
        while True:
            last = source.log(name, offset)
            if last["text"]:
                out.print(last["text"], end="", markup=False, highlight=False, soft_wrap=True,
                          emoji=False)
            offset = last["offset"]
            if not last["active"] and not last["more"]:
                break
            if not last["more"]:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        if not started:
            try:
                source.cancel(name)
                err.print(f"Cancelled job {name} (it was still queued).", highlight=False)
                raise typer.Exit(CTRL_C_EXIT) from None
            except ConflictError:  # the queue started it at that moment: stop it instead
                _until_started(source, name)
        source.stop(name)
        err.print(f"Stopped job {name}.", highlight=False)
        raise typer.Exit(CTRL_C_EXIT) from None
    status = last.get("status")
    err.print(f"Job {name}: {status}" + (f" ({last['reason']})" if last.get("reason") else ""),
              markup=False, highlight=False)
    raise typer.Exit(exit_code(str(status)))


def queued_headline(entry: QueuedJob) -> str:
    """The first line about a job that was queued: why it did not start at once."""
    why = f"it starts once {entry.after} succeeded" if entry.after else "its devices are busy"
    return f"Job {entry.name} is queued: {why}."


def queued_message(name: str, entry: QueuedJob | None, detach: bool) -> None:
    """Its place (once the queue planned it) and, with -d, what to do next."""
    from gpufleet.lifecycle import listing

    row = listing.queued_row(entry) if entry is not None else {}
    if row:
        err.print("  " + queue_line(row, time.time()), markup=False, highlight=False,
                  soft_wrap=True)
    if detach:
        err.print(f"  place:   gpufleet jobs\n  cancel:  gpufleet cancel {name}\n"
                  f"  hold:    gpufleet hold {name}   (keeps its place, does not start)\n"
                  f"  follow:  gpufleet logs {name} -f   (once it started)", highlight=False)


def print_queued(row: dict[str, Any], as_json: bool) -> None:

    if as_json:
        print_json(row)
        return
    if row["status"] == "started":
        out.print(f"Job {row['name']} is starting: the queue gave it its devices a moment ago.",
                  markup=False, highlight=False)
    elif row["status"] == "queued":
        out.print(f"Job {row['name']} ({devices_shown(row['gpu'], row['count'])}, user {row['user']}) is "
                  f"{queue_line(row, time.time())}", markup=False, highlight=False,
                  soft_wrap=True)
    else:
        out.print(f"Job {row['name']} left the queue without starting: {row['status']}"
                  + (f" ({row['reason']})" if row.get("reason") else ""), markup=False,
                  highlight=False)
