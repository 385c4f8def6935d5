"""Running a submitted job under its supervisor, and stopping jobs and clusters.

The supervisor is either a detached process of its own (`start_detached`) or this process
(`supervise_here`, with callbacks for a live view); either way its pid is in the store at once,
so a supervisor that dies at any point is found by `reconcile.reconcile`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from gpufleet.errors import ConflictError, NotFoundError, StateError
from gpufleet.launch import run_env
from gpufleet.lifecycle import clusters, jobs, reconcile
from gpufleet.lifecycle.provision import backend_of
from gpufleet.lifecycle.say import Say
from gpufleet.plan import cost
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Job, Store

if TYPE_CHECKING:
    from gpufleet.supervise.supervisor import Supervisor


class NotStarted(StateError):
    """The job's supervisor could not start; the job is failed with `why` and a cluster made
    for it is freed."""

    def __init__(self, job: str, why: str) -> None:
        super().__init__(f"job {job}: {why}")
        self.why = why


def start_detached(store: Store, job: Job, cpu_slots: int | None = None,
                   environ: Mapping[str, str] | None = None) -> int:
    """Start the job's own supervisor process and record it; its pid. It sees the pool as the
    caller did (`cpu_slots`), for an elastic job growing its cluster. `environ`: the
    environment to start it in (a queued job's submitting shell), else this process's; the
    state folder and database are always this process's.

    A supervisor that cannot start (its log cannot be opened, no interpreter) raises
    `NotStarted` after failing the job and freeing a cluster made for it: nothing else would,
    since the process that created the job (the server, or a CLI that reports the error) may
    live on, so `reconcile` never sees the job orphaned, and its devices stay held."""
    try:
        return _spawn(store, job, cpu_slots, environ)
    except OSError as exc:
        why = f"its supervisor could not start: {exc}"
        jobs.transition(store, job.id, JobStatus.FAILED, why, expect=(JobStatus.STARTING,))
        reconcile.free_own_cluster(store, job, keep=False)
        raise NotStarted(job.name, why) from None


def _spawn(store: Store, job: Job, cpu_slots: int | None,
           environ: Mapping[str, str] | None) -> int:
    env = run_env.supervisor_env(os.environ if environ is None else environ, os.environ,
                                 cpu_slots)
    with open(Path(job.job_dir) / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.supervise.supervisor", job.name], env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    with _children_lock:
        _children.append(proc)
    jobs.set_supervisor(store, job.id, proc.pid)
    return proc.pid


_children: list[subprocess.Popen[bytes]] = []  # supervisors this process started
_children_lock = threading.Lock()  # the server starts them from request threads and its loop


def reap() -> int:
    """Collect the exit of every supervisor this process started that has ended (a long-lived
    process, the server, would otherwise keep them as zombies); how many still run."""
    with _children_lock:
        _children[:] = [p for p in _children if p.poll() is None]
        return len(_children)


def supervise_here(store: Store, job: Job, cluster: Cluster, cpu_slots: int | None = None,
                   on_tick: Callable[[Any], None] | None = None,
                   on_line: Callable[[int | None, str], None] | None = None
                   ) -> tuple[Job, Supervisor]:
    """Supervise the job in this process until it ends; the job as it ended, and its
    supervisor (for the final view, `.view()`, and whether Ctrl-C ended it, `.interrupted`)."""
    from gpufleet.supervise.supervisor import Supervisor

    jobs.set_supervisor(store, job.id, os.getpid())
    sup = Supervisor(store, job, cluster, backend_of(store, cluster, cpu_slots),
                     on_tick=on_tick, on_line=on_line)
    return sup.run(), sup


def stop_job(store: Store, job: Job, timeout_s: float = 30.0) -> Job:
    """Ask the job's supervisor to stop it and wait until it has; the job as it ended."""
    j = reconcile.refresh(store, job.name)  # as it is now, not as the caller first read it
    if j.status not in jobs.ACTIVE:
        return j
    if j.supervisor_pid is None:  # created a moment ago: its supervisor sees this and backs off
        if jobs.transition(store, j.id, JobStatus.STOPPED,
                           f"{jobs.STOP_REQUESTED} before it started", expect=(JobStatus.STARTING,)):
            reconcile.free_own_cluster(store, j, keep=False)  # it never ran: nothing to keep
        return jobs.get(store, j.name)
    jobs.mark_stop_requested(store, j.id)
    try:
        os.kill(j.supervisor_pid, signal.SIGTERM)
    except ProcessLookupError:  # it ended between our look and the signal
        reconcile.reconcile(store)
        return jobs.get(store, j.name)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        now = reconcile.refresh(store, j.name)
        if now.status not in jobs.ACTIVE:
            return now
        time.sleep(0.2)
    raise ConflictError(f"job {j.name}: the supervisor (pid {j.supervisor_pid}) did not stop "
                        f"within {timeout_s:.0f}s; it may still be ending its workers")


@dataclass(frozen=True)
class StopPlan:
    """What a stop request names, found before anything is stopped (so it can be shown)."""

    clusters: list[tuple[Cluster, Job | None]] = field(default_factory=list)  # with running job
    job: Job | None = None  # a job named by itself
    already_stopped: bool = False  # the name is a cluster that is not running


def plan_stop(store: Store, name: str | None, every: bool = False) -> StopPlan:
    """The running clusters (with their jobs) or the job that `name`, or `every`, stops."""
    with store.read() as s:
        if every:
            found = list(s.scalars(select(Cluster).where(Cluster.status.in_(clusters.ACTIVE))
                                   .order_by(Cluster.id)))
        else:
            named = list(s.scalars(select(Cluster).where(Cluster.name == name)))
            found = [c for c in named if c.status in clusters.ACTIVE]
            if not named:
                job = s.scalar(select(Job).where(Job.name == name))
                if job is None:
                    raise NotFoundError(f"name: no cluster or job named '{name}'")
                return StopPlan(job=job)
            if not found:
                return StopPlan(already_stopped=True)
    return StopPlan(clusters=[(c, clusters.running_job(store, c.id)) for c in found])


def stop_cluster(store: Store, cluster: Cluster,
                 say: Say | None = None) -> tuple[Cluster, float]:
    """Stop the cluster's running job, free its devices; the stopped cluster and its cost.
    `say` hears what `clusters.stop` has to tell."""
    running = clusters.running_job(store, cluster.id)
    if running is not None:
        stop_job(store, running)
    c = clusters.stop(store, cluster.name, cluster_id=cluster.id, say=say)
    spent = cost.accrued_usd(c.usd_per_hour, c.started_at, c.stopped_at, time.time(),
                             c.banked_usd or 0.0, c.rate_since)
    return c, spent
