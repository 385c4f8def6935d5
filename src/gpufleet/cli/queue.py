"""Queue commands: `jobs` (queued, running and ended jobs in one list) and `cancel`."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.app import COMMAND, app, err, out, print_json, remote, store
from gpufleet.cli.options import Json
from gpufleet.server.seg import seg

if TYPE_CHECKING:
    from gpufleet.server.client import Client
    from gpufleet.store import QueuedJob, Store


def queued_message(name: str, entry: QueuedJob | None, detach: bool) -> None:
    from gpufleet.cli.follow import queue_line
    from gpufleet.lifecycle import listing

    row = listing.queued_row(entry) if entry is not None else {}
    err.print(f"Job {name} is queued: its devices are busy.", highlight=False)
    if row:
        err.print("  " + queue_line(row, time.time()), markup=False, highlight=False,
                  soft_wrap=True)
    if detach:
        err.print(f"  place:   gpufleet jobs\n  cancel:  gpufleet cancel {name}\n"
                  f"  follow:  gpufleet logs {name} -f   (once it started)", highlight=False)


def _age(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    d = now - t
    return f"{d:.0f}s ago" if d < 60 else f"{d / 60:.0f}m ago" if d < 3600 else \
        f"{d / 3600:.1f}h ago"


def _table(rows: list[dict[str, Any]], now: float) -> Any:
    from rich.table import Table

    from gpufleet import ui
    from gpufleet.cli.follow import when

    t = Table(box=None, pad_edge=False)
    for col in ("JOB", "USER", "STATUS", "PRI", "DEVICES", "SUBMITTED", "START", "COST",
                "NOTE"):
        t.add_column(col, overflow="fold")
    for r in rows:
        queued = r["status"] == "queued"
        start = (f"#{r['position']} " if r.get("position") else "") + \
            when(r.get("est_start"), now).replace("in about ", "~") if queued else \
            _age(r.get("started_at"), now)
        if queued and r.get("est_start") is None:
            start = (f"#{r['position']} " if r.get("position") else "") + "?"
        status = r["status"]
        if r.get("slurm"):  # Slurm's own state of the allocation (squeue)
            status += f" (Slurm {r['slurm']['id']}: {r['slurm']['state'].lower()})"
        t.add_row(r["name"], r.get("user") or "-", status,
                  "-" if r.get("priority") is None else str(r["priority"]),
                  f"{r['count']} x {r['gpu']}", _age(r.get("submitted_at"), now), start,
                  ui.usd(r.get("cost_usd") or 0.0), r.get("reason") or "")
    return t


@app.command(cls=COMMAND)
def jobs(
    all_: Annotated[bool, typer.Option("--all", help="Every job, not just the last day's.")] = False,
    user: Annotated[str | None, typer.Option("--user", help="Only this user's jobs.")] = None,
    as_json: Json = False,
) -> None:
    """Queued, running and ended jobs: each queued one with its place, estimated start and why
    it waits. On a Slurm pool, Slurm's own state of each job's allocation, and the allocations
    still pending in Slurm's queue with Slurm's reason."""
    now = time.time()
    client = remote()
    if client is not None:
        rows = client.call("GET", "/api/v1/jobs", query={"all": str(all_).lower(), "user": user})
    else:
        from gpufleet.lifecycle import accounts, listing, queued
        from gpufleet.server import local
        from gpufleet.store import gpufleet_home

        st = store()
        if queued.waiting(st) and local.running(gpufleet_home()) is None:
            local.ensure(gpufleet_home())  # queued jobs, no one to start them: a server again
        rows = listing.table(st, accounts.local_identity(st), now, every=all_, user=user)
        from gpufleet.lifecycle import engine_alloc

        rows = engine_alloc.queue_rows(st, rows, now)  # Slurm's own state, where a pool is Slurm
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
    client = remote()
    if client is not None:
        client.call("POST", f"/api/v1/jobs/{seg(job)}/cancel")
    else:
        from gpufleet.lifecycle import accounts, queued

        st = store()
        queued.cancel(st, job, accounts.local_identity(st))
    out.print(f"Job {job}: cancelled (it was queued).")


def queue_row(st: Store, name: str) -> dict[str, Any] | None:
    """A job still in the queue (or that left it without starting), as `status` shows it."""
    from gpufleet.lifecycle import jobs, listing, queued

    if jobs.get_or_none(st, name) is not None:
        return None
    e = queued.entry(st, name)
    return {**listing.queued_row(e), "queued": True} if e is not None else None


def print_queued(row: dict[str, Any], as_json: bool) -> None:
    from gpufleet.cli.follow import queue_line

    if as_json:
        print_json(row)
        return
    if row["status"] == "started":
        out.print(f"Job {row['name']} is starting: the queue gave it its devices a moment ago.",
                  markup=False, highlight=False)
    elif row["status"] == "queued":
        out.print(f"Job {row['name']} ({row['count']} x {row['gpu']}, user {row['user']}) is "
                  f"{queue_line(row, time.time())}", markup=False, highlight=False,
                  soft_wrap=True)
    else:
        out.print(f"Job {row['name']} left the queue without starting: {row['status']}"
                  + (f" ({row['reason']})" if row.get("reason") else ""), markup=False,
                  highlight=False)


def queued_first(st: Store, name: str, follow: bool) -> None:
    """`logs` of a job that has not started: say so, and with -f wait for its start."""
    from gpufleet.cli.follow import queue_line
    from gpufleet.errors import ConflictError
    from gpufleet.lifecycle import jobs, listing, queued

    e = queued.entry(st, name)
    if e is None:
        return  # jobs.get then says which jobs there are
    if e.status not in ("queued", "started"):  # started: its record is a moment away
        raise ConflictError(f"logs: job '{name}' left the queue without starting ({e.status}"
                            f"{': ' + e.reason if e.reason else ''}); it has no log")
    from gpufleet.cli.app import err

    now = "starting" if e.status == "started" else queue_line(listing.queued_row(e), time.time())
    err.print(f"Job {name} is {now}; its log starts when it runs.", markup=False,
              highlight=False, soft_wrap=True)
    if not follow:
        raise typer.Exit(0)
    while jobs.get_or_none(st, name) is None:
        e = queued.entry(st, name)
        if e is None or e.status not in ("queued", "started"):
            raise ConflictError(f"logs: job '{name}' left the queue without starting")
        time.sleep(0.5)


def remote_logs(client: Client, name: str, follow: bool, rank: int | None) -> str:
    """`logs` through the server; the job's status when it returns."""
    offset = 0
    while True:
        got = client.call("GET", f"/api/v1/jobs/{seg(name)}/logs",
                          query={"offset": offset, "rank": rank})
        sys.stdout.write(got["text"])
        sys.stdout.flush()
        offset = got["offset"]
        if got["more"]:
            continue
        if not follow or not got["active"]:
            return str(got["status"])
        time.sleep(1.0)
