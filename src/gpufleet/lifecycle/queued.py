"""The queue on the store: a job that cannot start now waits here for its turn.

`run_or_queue` is what `gpufleet run` does (and what the server's POST /jobs does): start the
job at once when nothing waits ahead of it, its team is within its limits and its devices are
free; otherwise check everything that would refuse it later (so a queued job is one that can
run) and record it. The server's loop (`lifecycle.dispatch`) starts queued jobs in turn.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select, update

from gpufleet.backends.kinds import capabilities
from gpufleet.errors import AllocationError, ConflictError, LimitError, NotFoundError, SpecError
from gpufleet.lifecycle import (
    accounts,
    admission,
    clusters,
    depends,
    images,
    jobs,
    pools,
    submit,
    teams,
)
from gpufleet.lifecycle.accounts import Identity
from gpufleet.lifecycle.admission import Facts
from gpufleet.lifecycle.provision import Approve, Offer
from gpufleet.lifecycle.say import Say
from gpufleet.pool.allocate import allocate
from gpufleet.sched import admit
from gpufleet.sched import after as after_rule
from gpufleet.sched.model import Limits, Waiting
from gpufleet.slot_words import devices_shown
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.status import QueueStatus
from gpufleet.store import Cluster, Job, QueuedJob, Store


@dataclass(frozen=True)
class Need:
    """What a job waits for: devices of one type on one pool, or a whole existing cluster."""

    pool: str
    gpu: str
    count: int
    cluster: str | None
    usd_per_hour: float
    time_limit_s: float | None


def need_of(store: Store, spec: JobSpec) -> Need:
    if isinstance(spec.cluster, ClusterSpec):
        c = spec.cluster
        rate = clusters.quote_for(c).usd_per_hour
        # spare nodes are held and billed too: the queue waits for them, quotas count them
        return Need(c.pool or "local", c.gpu, c.billed_count, None, rate, spec.time_limit_s)
    assert spec.cluster is not None
    row = clusters.get(store, spec.cluster)
    if row.status not in clusters.ACTIVE:
        raise ConflictError(f"cluster: '{row.name}' is {row.status}; launch a new one")
    return Need(row.pool or "local", row.gpu, row.billed_devices, row.name, row.usd_per_hour,
                spec.time_limit_s)


def waiting_of(e: QueuedJob) -> Waiting:
    return Waiting(e.name, e.user, e.team, e.priority, e.submitted_at, (e.pool, e.gpu), e.count,
                   e.cluster, e.time_limit_s, e.usd_per_hour, e.after, e.held_by is not None)


def _never_fits(store: Store, spec: ClusterSpec, cpu_slots: int | None) -> AllocationError | None:
    """The refusal the pool would give this request if nothing at all were reserved: a job
    that could never start is refused now, not queued forever."""
    prow = pools.resolve(store, spec.pool, spec.backend)
    nodes = pools.backend_for(prow, cpu_slots).discover()
    try:
        allocate(spec.gpu, spec.count, spec.node_count if prow is None else spec.nodes,
                 spec.fabric if prow is None else spec.network, nodes, {})
    except AllocationError as exc:
        return exc
    return None


def limits_now(store: Store, now: float) -> Limits:
    from gpufleet.lifecycle import ledger

    with store.read() as s:
        quotas = accounts.quotas(s)
        budgets = accounts.budgets_for(s, accounts.current_month(now))
    if budgets:  # book what running jobs spent up to now before judging what is left
        ledger.accrue(store, now)
    spent = ledger.spent_since(store, ledger.month_start(now)) if budgets else {}
    return Limits(quotas, {t: b - spent.get(t, 0.0) for t, b in budgets.items()}, budgets)


def check_queueable(store: Store, spec: JobSpec, cpu_slots: int | None,
                    approve: Approve) -> Need:
    """Every refusal `submit` would give that does not depend on what is busy now, and the
    quote approved: what a queued job has passed."""
    need = need_of(store, spec)
    spec = images.with_image(store, spec)  # checked as it will start (dispatch: submit)
    if isinstance(spec.cluster, ClusterSpec):
        c = spec.cluster
        admission.or_raise(admission.admit(spec, admission.of_spec(c),
                                           Facts(source=submit.script_source(spec))))
        submit.check_environment(spec, c.backend)
        problem = _never_fits(store, c, cpu_slots)
        if problem is not None:
            raise problem
        q = clusters.quote_for(c)
        approve(Offer(c, c.pool, c.fabric, q))
    else:
        row = clusters.get(store, need.cluster or "")
        admission.or_raise(admission.admit(spec, admission.of_cluster(row),
                                           Facts(source=submit.script_source(spec))))
        submit.check_environment(spec, row.backend)
    return need


def enqueue(store: Store, spec: JobSpec, who: Identity, need: Need, cpu_slots: int | None,
            now: float, picked: bool = False,
            environ: Mapping[str, str] | None = None) -> QueuedJob:
    """Record the job in the queue. `picked`: its name was picked for it, not given, so a name
    another submission took since it was picked is picked again here, not refused.
    `environ`: the submitter's environment, for its supervisor when it starts."""
    assert spec.name is not None
    with store.session() as s:
        for _ in range(jobs.PICKS):
            if not (s.scalar(select(Job.id).where(Job.name == spec.name)) or
                    s.scalar(select(QueuedJob.id).where(QueuedJob.name == spec.name))):
                break
            if not picked:
                raise jobs.name_taken_error(spec.name)
            spec = spec.model_copy(update={"name": jobs.job_name_for(
                spec.model_copy(update={"name": None}))})
        else:
            raise ConflictError(f"name: {jobs.PICKS} names picked for {spec.script} were all "
                                "taken; give the job a name (--name)")
        assert spec.name is not None
        entry = QueuedJob(name=spec.name, user=who.user, team=who.team, priority=spec.priority,
                          submitted_at=now, spec_json=spec.model_dump_json(), cpu_slots=cpu_slots,
                          env_json=None if environ is None else json.dumps(dict(environ)),
                          pool=need.pool, gpu=need.gpu, count=need.count, cluster=need.cluster,
                          usd_per_hour=need.usd_per_hour, time_limit_s=need.time_limit_s,
                          status=QueueStatus.QUEUED, after=spec.after)
        s.add(entry)
        accounts.audit(s, who, "submit", spec.name,
                       f"queued: {devices_shown(need.gpu, need.count)} on {need.cluster or need.pool}, "
                       f"priority {spec.priority}"
                       + (f", after {spec.after}" if spec.after else ""), now)
    return entry


def _busy(store: Store, spec: JobSpec, cpu_slots: int | None) -> bool:
    """Whether the job's devices (or cluster) are taken now, so it would wait if queued."""
    if not isinstance(spec.cluster, ClusterSpec):
        row = clusters.get(store, spec.cluster or "")
        return clusters.running_job(store, row.id) is not None
    prow = pools.resolve(store, spec.cluster.pool, spec.cluster.backend)
    if capabilities(prow.kind if prow else None).allocates:
        return False  # the engine queues it (Slurm): gpufleet does not queue it again
    nodes = pools.backend_for(prow, cpu_slots).discover()
    try:
        clusters.check(store, spec.cluster, nodes, prow.name if prow else None)
    except AllocationError:
        return True
    return False


def _contending(store: Store, need: Need, in_use: Mapping[tuple[str, str], int],
                limits: Limits) -> bool:
    """Whether a queued job waits for what this one needs, so this one waits its turn too:
    one for the same existing cluster, or for new devices of the same pool and type. One that
    its team's quota or budget holds waits for that, not for the devices, and as in the
    scheduler (`sched.plan`) holds up no one; so does one held, or waiting for the job it runs
    after."""
    q = select(QueuedJob).where(QueuedJob.status == QueueStatus.QUEUED,
                                QueuedJob.held_by.is_(None))
    if need.cluster is not None:
        q = q.where(QueuedJob.cluster == need.cluster)
    else:
        q = q.where(QueuedJob.cluster.is_(None), QueuedJob.pool == need.pool,
                    QueuedJob.gpu == need.gpu)
    with store.read() as s:
        found = [waiting_of(e) for e in s.scalars(q)]
    done = depends.states(store, (w.after for w in found))
    return any(not (admit.quota_problem(w, in_use, limits)
                    or admit.budget_problem(w, limits.budget_left, limits)
                    or (w.after is not None and not after_rule.ready(done.get(w.after))))
               for w in found)


def run_or_queue(store: Store, spec: JobSpec, who: Identity, approve: Approve,
                 cpu_slots: int | None, queue: bool = True, now: float | None = None,
                 environ: Mapping[str, str] | None = None,
                 say: Say | None = None) -> tuple[Job, Cluster] | QueuedJob:
    """Start the job now, or queue it (`queue` False: refuse instead, with the reason).
    `environ`: the submitter's environment, kept for the start of a queued job (the state
    file is owner-only); None: the starting process's. `say`: hears an engine's pending
    reasons while a job that starts now waits for its grant."""
    now = time.time() if now is None else now
    picked = not spec.name
    spec = spec.model_copy(update={"name": jobs.free_name_for(store, spec)})
    assert spec.name is not None
    need = need_of(store, spec)
    if need.cluster is not None:  # someone's launched cluster is theirs to run on
        accounts.may_act_on(who, clusters.get(store, need.cluster).user or who.user,
                            f"cluster {need.cluster}")
    limits = limits_now(store, now)
    w = Waiting(spec.name, who.user, who.team, spec.priority, now, (need.pool, need.gpu),
                need.count, need.cluster, need.time_limit_s, need.usd_per_hour)
    never = admit.never_fits(w, limits)
    if never:
        field, why = never.split(": ", 1)
        raise SpecError([(field, why)])
    first = None if spec.after is None else depends.check(store, spec.after, who)
    in_use = teams.in_use(store)
    ahead = _contending(store, need, in_use, limits)
    held = admit.quota_problem(w, in_use, limits) or \
        admit.budget_problem(w, limits.budget_left, limits)
    if spec.after is not None and not after_rule.ready(first):
        if not queue:
            raise ConflictError(f"after: job {spec.after} has not succeeded yet (it is "
                                f"{first}); without --no-queue this job would wait for it")
        held = "it runs after a job that has not succeeded yet"
    if not queue:
        if held:
            raise ConflictError(f"limits: {held} (without --no-queue it would wait in the queue)")
        if ahead:
            raise ConflictError("queue: jobs are waiting for these devices; without --no-queue "
                                "this job would wait its turn (gpufleet jobs)")
        return _started(submit.submit(store, spec, approve, cpu_slots,
                                      owner=(who.user, who.team), say=say), who, now, store)
    if not ahead and not held and not _busy(store, spec, cpu_slots):
        try:
            return _started(submit.submit(store, spec, approve, cpu_slots,
                                          owner=(who.user, who.team), say=say), who, now, store)
        except LimitError:
            pass  # another start of the team took its quota a moment ago: wait for it
        except (AllocationError, ConflictError):
            if not _busy(store, spec, cpu_slots):
                raise  # refused for a reason other than devices taken a moment ago
    need = check_queueable(store, spec, cpu_slots, approve)
    return enqueue(store, spec, who, need, cpu_slots, now, picked, environ)


def _started(result: object, who: Identity, now: float, store: Store) -> tuple[Job, Cluster]:
    assert isinstance(result, tuple)
    job, cluster = result
    with store.session() as s:
        accounts.audit(s, who, "submit", job.name, f"started at once on cluster {cluster.name}",
                       now)
    return job, cluster


def entry(store: Store, name: str) -> QueuedJob | None:
    with store.read() as s:
        return s.scalar(select(QueuedJob).where(QueuedJob.name == name))


def waiting(store: Store) -> list[QueuedJob]:
    with store.read() as s:
        return list(s.scalars(select(QueuedJob).where(QueuedJob.status == QueueStatus.QUEUED)
                              .order_by(QueuedJob.id)))


def cancel(store: Store, name: str, who: Identity, now: float | None = None) -> QueuedJob:
    """Take a queued job out of the queue (its owner or an admin)."""
    now = time.time() if now is None else now
    e = entry(store, name)
    if e is None:
        if jobs.get_or_none(store, name) is not None:
            raise ConflictError(f"cancel: job '{name}' is not queued (it started); stop it "
                                f"with gpufleet stop {name}")
        raise NotFoundError(f"job: no queued job named '{name}' (gpufleet jobs)")
    accounts.may_act_on(who, e.user, f"cancel {name}")
    if e.status != QueueStatus.QUEUED:
        hint = f"; stop it with gpufleet stop {name}" if e.status == QueueStatus.STARTED else ""
        raise ConflictError(f"cancel: job '{name}' is {e.status}, not queued{hint}")
    with store.session() as s:
        done = s.execute(update(QueuedJob).where(QueuedJob.id == e.id,
                                                 QueuedJob.status == QueueStatus.QUEUED)
                         .values(status=QueueStatus.CANCELLED, left_at=now,
                                 reason=f"cancelled by {who.user}", env_json=None))
        if getattr(done, "rowcount", 1) == 0:
            raise ConflictError(f"cancel: job '{name}' left the queue a moment ago "
                                f"(gpufleet jobs --all)")
        accounts.audit(s, who, "cancel", name, "", now)
    found = entry(store, name)
    assert found is not None
    return found
