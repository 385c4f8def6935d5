"""Job records: creation, lifecycle transitions as events, and reconciling dead supervisors."""

from __future__ import annotations

import json
import secrets
import time
from contextlib import suppress
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.errors import ConflictError, LimitError, NotFoundError
from gpufleet.lifecycle import job_runs, owners
from gpufleet.slot_words import devices_shown
from gpufleet.spec import JobSpec, check_name
from gpufleet.status import CLUSTER_ACTIVE, JOB_ACTIVE, JOB_FINAL, JobStatus
from gpufleet.store import Cluster, Event, Job, Metric, Store, gpufleet_home
from gpufleet.telemetry.schema import MODEL_STATE_METRICS

ACTIVE = JOB_ACTIVE
FINAL = JOB_FINAL
STOP_REQUESTED = "stopped by user (gpufleet stop)"
PICKS = 16  # names tried for a job without one


def job_name_for(spec: JobSpec) -> str:
    if spec.name:
        return spec.name
    stem = "".join(c if c.isalnum() else "-" for c in Path(spec.script).stem.lower()).strip("-")
    stem = (stem or "job")[:24]
    if not stem[0].isalpha():
        stem = "job-" + stem
    return check_name(f"{stem}-{secrets.token_hex(2)}", "job")


def name_taken(store: Store, name: str, queued_ok: bool = False) -> bool:
    """Whether a job or a queued job has the name; `queued_ok`: the queue's own entry of that
    name is the job being started."""
    from gpufleet.store import QueuedJob

    with store.read() as s:
        return s.scalar(select(Job.id).where(Job.name == name)) is not None or (
            not queued_ok and s.scalar(select(QueuedJob.id).where(QueuedJob.name == name))
            is not None)


def name_taken_error(name: str) -> ConflictError:
    return ConflictError(f"name: a job named '{name}' already exists; pick another name")


def check_name_free(store: Store, name: str, queued_ok: bool = False) -> None:
    """Refuse a name a job or a queued job has (`name_taken`)."""
    if name_taken(store, name, queued_ok):
        raise name_taken_error(name)


def free_name_for(store: Store, spec: JobSpec) -> str:
    """The job's own name (refused if taken), or one picked for it that no job has: picked
    names are random, and a queue keeps its history, so a picked name may be taken already."""
    if spec.name:
        check_name_free(store, spec.name)
        return spec.name
    for _ in range(PICKS):
        name = job_name_for(spec)
        with suppress(ConflictError):
            check_name_free(store, name)
            return name
    raise ConflictError(f"name: {PICKS} names picked for {spec.script} were all taken; give "
                        "the job a name (--name)")


def _busy_with(s: Session, cluster: Cluster) -> str | None:
    return s.scalar(select(Job.name).where(Job.cluster_id == cluster.id, Job.status.in_(ACTIVE)))


def busy_error(cluster: str, job: str) -> ConflictError:
    return ConflictError(f"cluster: '{cluster}' is busy with job '{job}'; wait for it, stop it "
                         f"(gpufleet stop {job}) or use another cluster")


def _check_cluster_free(s: Session, cluster: Cluster) -> None:
    busy = _busy_with(s, cluster)
    if busy is not None:
        raise busy_error(cluster.name, busy)


def _check_quota(s: Session, team: str, cluster: Cluster) -> None:
    """The team's quota, checked again in the transaction that records the job: two starts
    that each saw room for one job (the API's threads, the server's loop, two CLIs) cannot
    both take it. Writers serialize, so what this reads is what is committed."""
    from gpufleet.store import Quota

    cap = s.scalar(select(Quota.devices).where(Quota.team == team, Quota.gpu == cluster.gpu))
    if cap is None:
        return
    from gpufleet.lifecycle import held as holding

    held = holding.by_team(s, exclude=cluster.id).get((team, cluster.gpu), 0)
    if held + cluster.count > cap:
        raise LimitError(f"limits: team {team}'s quota is {devices_shown(cluster.gpu, cap)} at once and "
                         f"{held} are in use")


def busy_with(store: Store, cluster: Cluster) -> str | None:
    """The job running on the cluster, if any (checked again, atomically, by `create`)."""
    with store.read() as s:
        return _busy_with(s, cluster)


def check_cluster_free(store: Store, cluster: Cluster) -> None:
    """Refuse a cluster another job is running on (`busy_with`)."""
    busy = busy_with(store, cluster)
    if busy is not None:
        raise busy_error(cluster.name, busy)


def create(store: Store, spec: JobSpec, cluster: Cluster, world_size: int,
           owner: tuple[str, str | None] | None = None) -> Job:
    """The job's record on its cluster; `owner`: (user, team) it is billed to (default: the
    OS user, no team)."""
    from gpufleet.lifecycle.accounts import os_user

    name = job_name_for(spec)
    user, team = owner if owner is not None else (os_user(), None)
    job_dir = gpufleet_home() / "jobs" / name
    with store.session() as s:
        if s.scalar(select(Job).where(Job.name == name)) is not None:
            raise name_taken_error(name)
        _check_cluster_free(s, cluster)
        if team is not None:
            _check_quota(s, team, cluster)
        creator = owners.me()  # until the caller records the supervisor's pid
        job = Job(name=name, cluster_id=cluster.id, status=JobStatus.STARTING,
                  spec_json=spec.model_dump_json(), job_dir=str(job_dir),
                  world_size=world_size, created_at=time.time(), samples=0,
                  creator_pid=creator.pid, creator_started=creator.started, user=user,
                  team=team, billed_micro_usd=0)
        s.add(job)
        s.flush()
        on = s.get(Cluster, cluster.id)
        assert on is not None
        job_runs.open_run(s, job, on, job.created_at, fresh=on.for_job == name)
        s.add(Event(job_id=job.id, time=job.created_at, kind=JobStatus.STARTING,
                    reason=f"{world_size} worker(s) on cluster {cluster.name}"))
    job_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return job


def transition(store: Store, job_id: int, status: JobStatus, reason: str = "",
               expect: tuple[JobStatus, ...] = ACTIVE, fields: dict[str, object] | None = None) -> bool:
    """Move a job to `status` if it is still in one of `expect`; False (and no change) if not.

    Compare-and-set in one write transaction, so a `stop` and a starting supervisor cannot undo
    each other: whoever comes second sees the other's status and backs off.
    """
    now = time.time()
    with store.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.status not in expect:
            return False
        job.status = status
        if status == JobStatus.RUNNING and job.started_at is None:
            job.started_at = now
        if status in FINAL:
            job.ended_at = now
            job.reason = reason or job.reason
            job_runs.job_ended(s, job, now)
        for k, v in (fields or {}).items():
            setattr(job, k, v)
        s.add(Event(job_id=job_id, time=now, kind=status, reason=reason))
        return True


def begin_running(store: Store, job_id: int, cluster_id: int, reason: str) -> bool:
    """starting -> running, only if nobody stopped the job or its cluster meanwhile."""

    with store.session() as s:
        cluster = s.get(Cluster, cluster_id)
        if cluster is None or cluster.status not in CLUSTER_ACTIVE:
            return False
    return transition(store, job_id, JobStatus.RUNNING, reason, expect=(JobStatus.STARTING,))


def set_supervisor(store: Store, job_id: int, pid: int) -> None:
    """Record the supervisor's pid and start time as soon as it exists, so a job whose
    supervisor dies at any point, even before it starts workers, is found by `reconcile`; the
    cluster made for the job passes from its creator to it in the same write."""
    started = owners.started_of(pid)
    with store.session() as s:
        job = s.get(Job, job_id)
        if job is not None:
            job.supervisor_pid, job.supervisor_started = pid, started
            c = s.get(Cluster, job.cluster_id)
            if c is not None and c.for_job == job.name:
                c.owner_pid = c.owner_started = None


def add_event(store: Store, job_id: int, kind: str, reason: str, t: float | None = None) -> None:
    """An event that is not a status change: a checkpoint, a failed worker, a scaling decision."""
    with store.session() as s:
        s.add(Event(job_id=job_id, time=t if t is not None else time.time(), kind=kind,
                    reason=reason))


def reopen(store: Store, job: Job, cluster: Cluster, world_size: int, reason: str) -> Job:
    """An ended job starts again (`run --resume`), on `cluster`, as the same record: its events,
    metrics and checkpoints continue."""
    now = time.time()
    with store.session() as s:
        row = s.get(Job, job.id)
        if row is None or row.status not in FINAL:
            raise ConflictError(f"job: '{job.name}' is {row.status if row else 'gone'}; only an "
                                "ended job can be resumed")
        before = s.get(Cluster, row.cluster_id)
        if before is not None:  # still open if the job's own cluster outlived its supervisor
            job_runs.close_run(s, row, before, now)
        on = s.get(Cluster, cluster.id)
        assert on is not None
        fresh = on.for_job == row.name and on.id != row.cluster_id  # made for this resume
        row.status, row.cluster_id, row.world_size = JobStatus.STARTING, cluster.id, world_size
        job_runs.open_run(s, row, on, now, fresh)
        row.ended_at = row.exit_code = row.reason = None
        row.supervisor_pid = row.supervisor_started = None
        creator = owners.me()
        row.creator_pid, row.creator_started = creator.pid, creator.started
        row.first_step = row.first_step_at = row.samples_per_s = None
        s.add(Event(job_id=job.id, time=now, kind=JobStatus.STARTING, reason=reason))
    return get(store, job.name)


def get_or_none(store: Store, name: str) -> Job | None:
    with store.read() as s:
        return s.scalar(select(Job).where(Job.name == name))


def get(store: Store, name: str) -> Job:
    with store.read() as s:
        job = s.scalar(select(Job).where(Job.name == name))
        if job is None:
            recent = s.scalars(select(Job.name).order_by(Job.id.desc()).limit(5)).all()
            raise NotFoundError(f"job: no job named '{name}' (recent: {', '.join(recent) or 'none'})")
        return job


def events(store: Store, job_id: int) -> list[Event]:
    with store.read() as s:
        return list(s.scalars(select(Event).where(Event.job_id == job_id)
                              .order_by(Event.time, Event.id)).all())


def model_state(store: Store, job_name: str) -> dict[int, dict[str, float]]:
    """Each rank's latest model-state bytes, as its worker reported them."""
    return model_states(store, [job_name]).get(job_name, {})


def model_states(store: Store, names: list[str]) -> dict[str, dict[int, dict[str, float]]]:
    """`model_state` of each of `names` (job -> rank -> bytes), in one query for all of them;
    a job that reported none is left out."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    with store.read() as s:
        for at in range(0, len(names), 500):
            rows = s.execute(select(Metric.job, Metric.rank, Metric.name, Metric.value)
                             .where(Metric.job.in_(names[at:at + 500]),
                                    Metric.name.in_(MODEL_STATE_METRICS))
                             .order_by(Metric.time)).all()
            for job, rank, name, value in rows:  # later rows win
                out.setdefault(job, {}).setdefault(rank, {})[name] = value
    return out


def spec_of(job: Job) -> JobSpec:
    return JobSpec.model_validate(json.loads(job.spec_json))


def mark_stop_requested(store: Store, job_id: int) -> None:
    """Say why before signalling the supervisor, so the job records who stopped it."""
    with store.session() as s:
        job = s.get(Job, job_id)
        if job is not None and job.status in ACTIVE:
            job.reason = STOP_REQUESTED

