"""Reconciling the store with the processes that should be behind it.

A job's record says `running` for as long as its supervisor lives; when the supervisor dies
(kill -9, OOM killer, a reboot) nothing in the job can write that down. So any command that reads
jobs first reconciles: a job whose supervisor is gone is marked ended (what its last run left is
ended first, `leftovers.py`), and what a `run` that died during start-up left (`owners.py`) is
undone, so a reservation never outlives both its creator and its supervisor.
"""

from __future__ import annotations

from sqlalchemy import select

from gpufleet.lifecycle import clusters, leftovers, owners
from gpufleet.lifecycle.jobs import ACTIVE, STOP_REQUESTED, get, spec_of, transition
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Job, Store


def supervisor_alive(job: Job) -> bool:
    """The recorded supervisor process still exists (same pid and same start time)."""
    if job.supervisor_pid is None:
        return False
    return owners.alive(owners.Holder(job.supervisor_pid, job.supervisor_started))


def _gone_outcome(job: Job) -> tuple[JobStatus, str]:
    """What a job whose supervisor vanished ended as. A `gpufleet stop` that lands while a
    detached supervisor is still importing kills it before its SIGTERM handler exists: the user
    asked for a stop and got one, so the job is stopped, not interrupted."""
    if job.reason == STOP_REQUESTED:
        return JobStatus.STOPPED, f"{STOP_REQUESTED}; the supervisor ended before recording it"
    return JobStatus.INTERRUPTED, "the supervisor process is gone"


def reconcile(store: Store) -> None:
    """Mark jobs whose supervisor died as interrupted and free clusters made only for them
    (unless the job asked to keep its cluster); undo what a `run` that died during start-up
    left (owners.py): its job record and the cluster it reserved."""

    with store.read() as s:
        active = list(s.scalars(select(Job).where(Job.status.in_(ACTIVE))).all())
        held = list(s.scalars(select(Cluster).where(Cluster.status.in_(clusters.ACTIVE),
                                                    Cluster.owner_pid.is_not(None))).all())
    live = {j.id: supervisor_alive(j) for j in active if j.supervisor_pid is not None}
    for job in active:
        if job.id not in live or live[job.id]:
            continue
        # before the job is final (and so resumable), end what the kill left of its last run
        assert job.supervisor_pid is not None
        leftovers.end_run(leftovers.RunIdentity(job.name, job.job_dir, job.supervisor_pid))
        if transition(store, job.id, *_gone_outcome(job)):
            free_own_cluster(store, job, keep=spec_of(job).keep)
    orphans = owners.orphaned(
        [owners.StartingJob(j.id, j.cluster_id, True, _holder(j.creator_pid, j.creator_started),
                            _holder(j.supervisor_pid, j.supervisor_started), live.get(j.id, False))
         for j in active],
        [owners.HeldCluster(c.id, owners.Holder(c.owner_pid, c.owner_started))
         for c in held if c.owner_pid is not None], owners.alive)
    for job in active:
        if job.id in orphans.jobs and _interrupt_unsupervised(store, job.id, orphans.jobs[job.id]):
            free_own_cluster(store, job, keep=False)  # it never ran: nothing to keep
    for cluster_id, why in orphans.clusters.items():
        with store.session() as s:
            c = s.get(Cluster, cluster_id)
            if c is None or c.owner_pid is None or c.status not in clusters.ACTIVE:
                continue  # handed to a supervisor, or stopped, since we looked
            c.owner_pid = c.owner_started = None
        clusters.stop(store, c.name, reason=why, cluster_id=cluster_id)


def _holder(pid: int | None, started: float | None) -> owners.Holder | None:
    return None if pid is None else owners.Holder(pid, started)


def _interrupt_unsupervised(store: Store, job_id: int, why: str) -> bool:
    """starting -> interrupted, only while the job still has no supervisor (compare-and-set:
    one recorded since we looked is alive and in charge)."""
    with store.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.status != JobStatus.STARTING or job.supervisor_pid is not None:
            return False
    return transition(store, job_id, JobStatus.INTERRUPTED, why, expect=(JobStatus.STARTING,))


def free_own_cluster(store: Store, job: Job, keep: bool) -> None:
    """Stop the cluster made for `job` if it is still running (and the job did not ask to keep it)."""
    with store.read() as s:
        c = s.get(Cluster, job.cluster_id)
    if c is not None and c.for_job == job.name and c.status in clusters.ACTIVE and not keep:
        clusters.stop(store, c.name, reason=f"job {job.name} ended", cluster_id=c.id)


def orphaned_start(job: Job) -> bool:
    """A job that never got a supervisor and whose creator is gone (reconcile undoes it)."""
    creator = _holder(job.creator_pid, job.creator_started)
    return (job.status == JobStatus.STARTING and job.supervisor_pid is None
            and creator is not None and not owners.alive(creator))


def refresh(store: Store, name: str) -> Job:
    """The job as it is now: if its supervisor died, that is recorded first (for followers such
    as `logs -f` and `status --watch`, which would otherwise wait forever)."""
    job = get(store, name)
    if job.status in ACTIVE and ((job.supervisor_pid is not None and not supervisor_alive(job))
                                 or orphaned_start(job)):
        reconcile(store)
        job = get(store, name)
    return job
