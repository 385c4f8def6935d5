"""Queue commands: `jobs` (queued, running and ended jobs in one list), `cancel`, `hold` and
`release`."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from gpufleet.cli.app import COMMAND, app, out, print_json
from gpufleet.cli.connect import client
from gpufleet.cli.options import Json
from gpufleet.slot_words import devices_shown


def _age(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    d = now - t
    return f"{d:.0f}s ago" if d < 60 else f"{d / 60:.0f}m ago" if d < 3600 else \
        f"{d / 3600:.1f}h ago"


def start_text(r: dict[str, Any], now: float) -> str:
    """The START column: a queued job's place and estimated start (or why there is none:
    held, after a job, what holds its devices has no end); how long ago a job started."""
    from gpufleet.cli.follow import when

    if r["status"] != "queued":
        return _age(r.get("started_at"), now)
    place = f"#{r['position']} " if r.get("position") else ""
    if r.get("est_start") is not None:
        return place + when(r["est_start"], now).replace("in about ", "~")
    return place + (r.get("start_note") or ("held" if r.get("held_by") else "-"))


def _table(rows: list[dict[str, Any]], now: float) -> Any:
    from rich.table import Table

    from gpufleet import ui

    t = Table(box=None, pad_edge=False)
    for col in ("JOB", "USER", "STATUS", "PRI", "DEVICES", "SUBMITTED", "START", "COST",
                "NOTE"):
        t.add_column(col, overflow="fold")
    for r in rows:
        held = r["status"] == "queued" and (r.get("held_by") or r.get("wait") == "held")
        status = "held" if held else r["status"]
        if r.get("allocation"):  # the engine's own state of the allocation (Slurm's squeue)
            a = r["allocation"]
            status += f" ({a['engine']} {a['id']}: {a['state'].lower()})"
        cost = r.get("cost_usd")
        t.add_row(r["name"], r.get("user") or "-", status,
                  "-" if r.get("priority") is None else str(r["priority"]),
                  devices_shown(r["gpu"], r["count"]), _age(r.get("submitted_at"), now),
                  start_text(r, now), "-" if cost is None else ui.usd(cost),
                  r.get("reason") or "")
    return t


@app.command(cls=COMMAND)
def jobs(
    all_: Annotated[bool, typer.Option("--all", help="Every job, not just the last day's.")] = False,
    user: Annotated[str | None, typer.Option("--user", help="Only this user's jobs.")] = None,
    as_json: Json = False,
) -> None:
    """The queue and your jobs: every queued job in its order (its place, estimated start and
    why it waits) and every running one, of all users (through a server, other users' job
    names are hidden unless you are an admin), then your ended jobs. On a Slurm pool, Slurm's
    own state of each job's allocation, and the allocations still pending in Slurm's queue
    with Slurm's reason."""
    now = time.time()
    rows = client().jobs(all_, user)
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("No jobs" + ("." if all_ else " in the last day (--all for every job)."))
        return
    out.print(_table(rows, now))


@app.command(cls=COMMAND)
def cancel(job: Annotated[str, typer.Argument(help="A queued job.")]) -> None:
    """Take a queued job out of the queue (a running one is stopped with gpufleet stop)."""
    client().cancel(job)
    out.print(f"Job {job}: cancelled (it was queued).")


def _hold_or_release(job: str, action: str) -> None:
    on = client()
    changed = on.hold(job) if action == "hold" else on.release(job)
    if action == "hold":
        out.print(f"Job {job}: held; it keeps its place in the queue but does not start until "
                  f"gpufleet release {job}." if changed else f"Job {job} is already held.",
                  highlight=False)
    else:
        out.print(f"Job {job}: released; it starts in its turn." if changed else
                  f"Job {job} is not held.", highlight=False)


@app.command(cls=COMMAND)
def hold(job: Annotated[str, typer.Argument(help="A queued job of yours.")]) -> None:
    """Keep a queued job from starting: it keeps its place (and priority) in the queue until
    gpufleet release. Your own jobs; an admin anyone's."""
    _hold_or_release(job, "hold")


@app.command(cls=COMMAND)
def release(job: Annotated[str, typer.Argument(help="A held job.")]) -> None:
    """Let a held job start again in its turn. A job an admin held is the admin's to
    release."""
    _hold_or_release(job, "release")
