"""Queue commands: `jobs` (queued, running and ended jobs in one list), `cancel`, `hold` and
`release`."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.app import COMMAND, app, err, out, print_json, remote, store
from gpufleet.cli.options import Json
from gpufleet.server.seg import seg
from gpufleet.slot_words import devices_shown

if TYPE_CHECKING:
    from gpufleet.server.client import Client
    from gpufleet.store import QueuedJob, Store


def queued_headline(entry: QueuedJob) -> str:
    """The first line about a job that was queued: why it did not start at once."""
    why = f"it starts once {entry.after} succeeded" if entry.after else "its devices are busy"
    return f"Job {entry.name} is queued: {why}."


def queued_message(name: str, entry: QueuedJob | None, detach: bool) -> None:
    """Its place (once the queue planned it) and, with -d, what to do next."""
    from gpufleet.cli.follow import queue_line
    from gpufleet.lifecycle import listing

    row = listing.queued_row(entry) if entry is not None else {}
    if row:
        err.print("  " + queue_line(row, time.time()), markup=False, highlight=False,
                  soft_wrap=True)
    if detach:
        err.print(f"  place:   gpufleet jobs\n  cancel:  gpufleet cancel {name}\n"
                  f"  hold:    gpufleet hold {name}   (keeps its place, does not start)\n"
                  f"  follow:  gpufleet logs {name} -f   (once it started)", highlight=False)


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
    client = remote()
    if client is not None:
        rows = client.call("GET", "/api/v1/jobs", query={"all": str(all_).lower(), "user": user,
                                                         "everyone": "true"})
    else:
        from gpufleet.lifecycle import accounts, listing, queued
        from gpufleet.server import local
        from gpufleet.store import gpufleet_home

        st = store()
        if queued.waiting(st) and local.running(gpufleet_home()) is None:
            # queued jobs, no one to start them (after a reboot, say): a server again
            err.print("Starting the local queue server (jobs are queued and none serves "
                      "them; a few seconds)...", highlight=False)
            local.ensure(gpufleet_home())
        rows = listing.table(st, accounts.local_identity(st), now, every=all_, user=user,
                             everyone=True)
        from gpufleet.lifecycle import engine_alloc

        rows = engine_alloc.queue_rows(st, rows, now)  # the engine's own state, where it allocates
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


def _hold_or_release(job: str, action: str) -> None:
    client = remote()
    if client is not None:
        changed = client.call("POST", f"/api/v1/jobs/{seg(job)}/{action}")["changed"]
    else:
        from gpufleet.lifecycle import accounts, hold_release

        st = store()
        do = hold_release.hold if action == "hold" else hold_release.release
        changed = do(st, job, accounts.local_identity(st))
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
        out.print(f"Job {row['name']} ({devices_shown(row['gpu'], row['count'])}, user {row['user']}) is "
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
    """`logs` through the server; the job's status when it returns. A job still queued is
    said to be (where it waits) as `logs` says on this machine, and -f waits for its start."""
    from gpufleet.cli.follow import queue_line

    offset = 0
    told = False
    while True:
        got = client.call("GET", f"/api/v1/jobs/{seg(name)}/logs",
                          query={"offset": offset, "rank": rank})
        waiting = got.get("waiting")
        if waiting is not None:
            if not told:
                now = "starting" if waiting["status"] == "started" else \
                    queue_line(waiting, time.time())
                err.print(f"Job {name} is {now}; its log starts when it runs.", markup=False,
                          highlight=False, soft_wrap=True)
                told = True
            if not follow:
                raise typer.Exit(0)
            time.sleep(1.0)
            continue
        sys.stdout.write(got["text"])
        sys.stdout.flush()
        offset = got["offset"]
        if got["more"]:
            continue
        if not follow or not got["active"]:
            return str(got["status"])
        time.sleep(1.0)
