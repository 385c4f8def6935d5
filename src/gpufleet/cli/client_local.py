"""`FleetClient` on this machine's own state: each method calls `gpufleet.lifecycle` (or the
state-file readers) as the local user, the identity that owns this machine's store.

Every library import is inside the method that needs it: `list` reads the state file with
sqlite3 and never opens the store, so it imports neither SQLAlchemy nor Pydantic.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli.app import approve_quote, confirm, err, out, say
from gpufleet.cli.app import store as open_store
from gpufleet.cli.client import JobInput, Launched
from gpufleet.errors import SpecError
from gpufleet.slot_words import devices_shown, network_shown

if TYPE_CHECKING:
    from gpufleet.lifecycle.accounts import Identity
    from gpufleet.lifecycle.runs import StopPlan
    from gpufleet.store import Store


class LocalClient:
    poll_s = 0.5

    def __init__(self) -> None:
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        """Opened on first use (it records jobs whose supervisor died), then kept."""
        if self._store is None:
            self._store = open_store()
        return self._store

    def me(self) -> Identity:
        from gpufleet.lifecycle import accounts

        return accounts.local_identity(self.store)

    def refuse_here_only(self, command: str) -> None:
        return None

    def launch(self, spec: dict[str, Any], yes: bool, as_json: bool,
               cpu_slots: int | None) -> Launched:
        from gpufleet.lifecycle import clusters
        from gpufleet.lifecycle.provision import provision, with_pool
        from gpufleet.spec import ClusterSpec
        from gpufleet.views import cluster_rows, pool_nodes

        st = self.store
        c = provision(st, ClusterSpec.parse(with_pool(st, spec)),
                      approve_quote(yes, quiet=as_json), cpu_slots, say=say)
        row = cluster_rows(st, [c], time.time(), pool_nodes(st, cpu_slots))[0] if as_json \
            else None
        where = "; ".join(f"{p.node_id}: {','.join(d.id for d in p.devices)}"
                          for p in clusters.placements(st, c))
        sim = " (simulated, not billed)" if c.simulated else ""
        spare = [p.node_id for p in clusters.spares(st, c)]
        held = f", spare node(s): {', '.join(spare)}" if spare else ""
        return Launched(c.name, c.gpu, c.count, f"{sim} on {c.nodes} node(s) ({where}{held}) "
                        f"over {network_shown(c.gpu, c.network)}", row)

    def clusters(self, every: bool) -> list[dict[str, Any]]:
        """Read straight from the state file when nothing needs the store's upkeep or a pool's
        devices (see `gpufleet.snapshot`), else through the store."""
        from gpufleet.snapshot import cluster_rows as quick_rows
        from gpufleet.snapshot import state_path

        now = time.time()
        quick = quick_rows(state_path(), every, now)
        if quick is not None:
            return quick
        from sqlalchemy import select

        from gpufleet.status import CLUSTER_ACTIVE
        from gpufleet.store import Cluster
        from gpufleet.views import cluster_rows, pool_nodes

        st = self.store
        q = select(Cluster).order_by(Cluster.id)
        if not every:
            q = q.where(Cluster.status.in_(CLUSTER_ACTIVE))
        with st.read() as s:
            found = list(s.scalars(q).all())
        return cluster_rows(st, found, now, pool_nodes(st))

    def stop(self, name: str | None, every: bool, yes: bool) -> None:
        """A queued job is cancelled, a running one stopped, a cluster (or, `every`, each one,
        with every queued job first) stopped after asking."""
        if every and not name and _nothing_running():
            out.print("No running clusters.")
            return
        from gpufleet.lifecycle import queued, runs

        st = self.store
        waiting = queued.entry(st, name) if name else None
        if waiting is not None and waiting.status == "queued":
            confirm(f"Cancel job {name} (queued)?", yes)
            queued.cancel(st, waiting.name, self.me())
            out.print(f"Job {name}: cancelled (it was queued)")
            return
        if every:
            for e in queued.waiting(st):  # or they would start on the devices this frees
                queued.cancel(st, e.name, self.me())
                out.print(f"Job {e.name}: cancelled (it was queued)")
        plan = runs.plan_stop(st, name, every=every)
        if plan.already_stopped:
            out.print(f"Cluster {name} is already stopped.")
            return
        if plan.job is not None:
            confirm(f"Stop job {plan.job.name} ({plan.job.status})?", yes)
            out.print(f"Job {plan.job.name}: {runs.stop_job(st, plan.job).status}")
            return
        if every:
            if not plan.clusters:
                out.print("No running clusters.")
                _end_idle_server()
                return
            out.print(f"Stopping {len(plan.clusters)} running cluster(s):", highlight=False)
            for line in _describe(plan):
                out.print(line, markup=False, highlight=False)
            confirm(f"Stop {len(plan.clusters)} cluster(s)?", yes)
        else:
            c, job = plan.clusters[0]
            running = f", its job {job.name} ends" if job is not None else ""
            confirm(f"Stop cluster {c.name} ({devices_shown(c.gpu, c.count)}{running})?", yes)
        for c, _job in plan.clusters:
            stopped, spent = runs.stop_cluster(st, c, say=say)
            out.print(f"Cluster {stopped.name}: {stopped.status}, devices freed, cost "
                      f"${spent:.4f}")
        if every:
            _end_idle_server()

    def run(self, job: JobInput, queue: bool, cpu_slots: int | None, detach: bool,
            dry_run: bool, yes: bool) -> None:
        """Started here under a supervisor, or queued for the local server, which this starts
        if none runs; then followed unless `detach`."""
        import os

        from gpufleet.cli.follow import (
            LocalSource,
            queued_headline,
            queued_message,
            wait_and_follow,
        )
        from gpufleet.cli.job_spec import job_spec
        from gpufleet.cli.supervising import hand_over, print_dry_run, script_notes, warned_first
        from gpufleet.lifecycle import queued, submit
        from gpufleet.server import local
        from gpufleet.store import gpufleet_home

        st, spec = job_spec(job.file, job.script, job.args, job.env, job.flags, job.inline,
                            job.cluster)
        self._store = st
        approve, tell = warned_first(script_notes(spec), approve_quote(yes))
        if dry_run:
            dry = submit.submit(st, spec, approve, cpu_slots, dry_run=True)
            tell()
            assert not isinstance(dry, tuple)
            print_dry_run(dry)
            return
        result = queued.run_or_queue(st, spec, self.me(), approve, cpu_slots, queue=queue,
                                     environ=os.environ, say=say)
        tell()
        if isinstance(result, tuple):
            hand_over(st, *result, detach, cpu_slots)
            return
        err.print(queued_headline(result), highlight=False)
        if local.running(gpufleet_home()) is None:  # its start takes seconds: say why we wait
            err.print("Starting the local queue server (the first queued job starts it; a few "
                      "seconds)...", highlight=False)
        local.ensure(gpufleet_home(), cpu_slots)
        queued_message(result.name, queued.entry(st, result.name), detach)
        if not detach:
            wait_and_follow(LocalSource(st), result.name)

    def resume(self, name: str, yes: bool, cpu_slots: int | None, detach: bool) -> None:
        from gpufleet.cli.supervising import hand_over
        from gpufleet.lifecycle import submit

        st = self.store
        job, on = submit.resume(st, name, approve_quote(yes), cpu_slots, say=lambda note:
                                out.print(f"Resuming {name}: {note}.", markup=False,
                                          highlight=False, soft_wrap=True), waiting=say)
        hand_over(st, job, on, detach, cpu_slots)

    def job(self, name: str) -> dict[str, Any]:
        """An ended job is read straight from the state file (see gpufleet.snapshot_job); any
        other goes through the store, which first records a dead supervisor."""
        if self._store is None:
            from gpufleet.snapshot import state_path
            from gpufleet.snapshot_job import job_detail as ended_job_detail

            ended = ended_job_detail(state_path(), name, time.time())
            if ended is not None:
                return ended
        from gpufleet.lifecycle import jobs, listing, queued
        from gpufleet.views import job_detail

        st = self.store
        if jobs.get_or_none(st, name) is None:
            e = queued.entry(st, name)
            if e is not None:
                return {**listing.queued_row(e), "queued": True}
        return job_detail(st, name, time.time())

    def logs(self, name: str, follow: bool, rank: int | None) -> str:
        """With `follow`, until the job ended and its log is read to the end."""
        from gpufleet.errors import NotFoundError
        from gpufleet.lifecycle import jobs, reconcile

        st = self.store
        if jobs.get_or_none(st, name) is None:
            _queued_first(st, name, follow)
        j = jobs.get(st, name)
        path = Path(j.job_dir) / ("job.log" if rank is None else f"logs/rank{rank}.log")
        if rank is not None and not 0 <= rank < j.world_size:
            raise NotFoundError(f"rank: job {name} has ranks 0..{j.world_size - 1}, not {rank}")
        pos = 0
        while True:
            if path.exists():
                with open(path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos += len(chunk)
                sys.stdout.write(chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
            if not follow:
                return j.status
            j = reconcile.refresh(st, name)
            if j.status not in jobs.ACTIVE:
                if path.exists() and path.stat().st_size > pos:
                    continue
                return j.status
            time.sleep(0.5)

    def jobs(self, every: bool, user: str | None) -> list[dict[str, Any]]:
        """With Slurm's own state of each job's allocation, where a pool is Slurm."""
        from gpufleet.lifecycle import engine_alloc, listing, queued
        from gpufleet.server import local
        from gpufleet.store import gpufleet_home

        st = self.store
        if queued.waiting(st) and local.running(gpufleet_home()) is None:
            # queued jobs, no one to start them (after a reboot, say): a server again
            err.print("Starting the local queue server (jobs are queued and none serves "
                      "them; a few seconds)...", highlight=False)
            local.ensure(gpufleet_home())
        now = time.time()
        rows = listing.table(st, self.me(), now, every=every, user=user, everyone=True)
        return engine_alloc.queue_rows(st, rows, now)

    def cancel(self, name: str) -> None:
        from gpufleet.lifecycle import queued

        queued.cancel(self.store, name, self.me())

    def hold(self, name: str) -> bool:
        from gpufleet.lifecycle import hold_release

        return hold_release.hold(self.store, name, self.me())

    def release(self, name: str) -> bool:
        from gpufleet.lifecycle import hold_release

        return hold_release.release(self.store, name, self.me())

    def usage(self, by: str, since: str) -> dict[str, Any]:
        from gpufleet.lifecycle import ledger

        if by not in ledger.GROUPS:
            raise SpecError([("by", f"'{by}' is not a grouping; allowed: "
                              f"{', '.join(ledger.GROUPS)}")])
        start = time.time() - _duration_s(since)
        st = self.store
        ledger.accrue(st, time.time())
        return ledger.usage(ledger.rows(st, start), by, start)

    def pools(self, name: str | None) -> list[dict[str, Any]]:
        from gpufleet.lifecycle import pools

        return pools.listing(self.store, name)

    def add_user(self, name: str, team: str | None, admin: bool) -> str:
        from gpufleet.lifecycle import accounts

        return accounts.add_user(self.store, self.me(), name, team, admin)

    def users(self) -> list[dict[str, Any]]:
        from gpufleet.lifecycle import accounts

        accounts.require_admin(self.me(), "admin user list")
        return accounts.users(self.store)

    def remove_user(self, name: str) -> None:
        from gpufleet.lifecycle import accounts

        accounts.remove_user(self.store, self.me(), name)

    def set_quota(self, team: str, gpu: str, devices: int | None) -> dict[str, Any]:
        from gpufleet.lifecycle import accounts, teams

        accounts.set_quota(self.store, self.me(), team, gpu, devices)
        return teams.team_view(self.store, team, time.time())

    def set_budget(self, team: str, usd: float | None, month: str | None) -> dict[str, Any]:
        from gpufleet.lifecycle import accounts, teams

        accounts.set_budget(self.store, self.me(), team, usd, month, time.time())
        return teams.team_view(self.store, team, time.time())

    def teams(self) -> list[dict[str, Any]]:
        from gpufleet.lifecycle import teams

        st = self.store
        return [teams.team_view(st, t, time.time()) for t in teams.team_names(st)]

    def audit(self, since: str, user: str | None) -> list[dict[str, Any]]:
        from gpufleet.lifecycle import accounts

        start = time.time() - _duration_s(since)
        accounts.require_admin(self.me(), "admin audit")
        return accounts.audit_log(self.store, start, user)


def _duration_s(since: str) -> float:
    from gpufleet.spec import parse_duration

    try:
        return parse_duration(since)
    except ValueError as exc:
        raise SpecError([("since", str(exc))]) from None


def _queued_first(st: Store, name: str, follow: bool) -> None:
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


def _nothing_running() -> bool:
    """True when the state file shows no running cluster and no active job: `stop --all` then
    has nothing to do and answers without opening the store (a second of CPU on a small
    machine). Anything the quick reader cannot vouch for goes through the store."""
    from gpufleet.snapshot import cluster_rows as quick_rows
    from gpufleet.snapshot import state_path

    path = state_path()
    if (path.parent / "server.json").exists():  # a local server to end: through the store
        return False
    return quick_rows(path, False, time.time()) == []


def _end_idle_server() -> None:
    """After `stop --all` nothing is queued or running: the local server (if one runs) has
    nothing left to do, so it is ended now rather than when its idle time runs out."""
    import os
    import signal

    from gpufleet.home import home_path
    from gpufleet.server import local

    info = local.running(home_path())
    if info is not None:
        try:
            os.kill(int(info["pid"]), signal.SIGTERM)
        except ProcessLookupError:
            pass


def _describe(plan: StopPlan) -> list[str]:
    """One line per cluster a stop ends, with the job running on it."""
    lines = []
    for c, job in plan.clusters:
        running = f", job {job.name} ({job.status})" if job is not None else ""
        lines.append(f"  {c.name}: {devices_shown(c.gpu, c.count)}{running}")
    return lines
