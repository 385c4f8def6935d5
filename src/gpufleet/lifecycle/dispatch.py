"""One pass of the queue against the store: read what waits and what runs, ask the pure
scheduler (`gpufleet.sched.plan`), start what it says and record why the rest waits.

The server's loop calls `dispatch` every second. A start goes through `submit.submit` (the same
checks and reservation as a `run` that starts at once) and `runs.start_detached`, so a queued job
runs exactly as one started by hand; its entry says `started` from then on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import bindparam, select, update

from gpufleet.errors import AllocationError, ConflictError, GpufleetError, LimitError
from gpufleet.lifecycle import accounts, depends, jobs, pools, reconcile, runs, submit
from gpufleet.lifecycle.queued import limits_now, waiting_of
from gpufleet.pool.allocate import Allocator
from gpufleet.sched import admit
from gpufleet.sched import plan as scheduler
from gpufleet.sched.model import Plan, Resource, Running, Waiting
from gpufleet.sched.order import HALF_LIFE_S, Use, recent_gpu_hours
from gpufleet.spec import ClusterSpec, JobSpec, parse_duration
from gpufleet.status import CLUSTER_ACTIVE, JobStatus, QueueStatus
from gpufleet.store import Cluster, Job, QueuedJob, Store, User

USE_WINDOW_S = 7 * HALF_LIFE_S  # older use weighs under 1% in fair share


@dataclass
class Pass:
    """What one pass did: the plan, and the jobs it started (or could not)."""

    plan: Plan
    started: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    cancelled: dict[str, str] = field(default_factory=dict)  # what they ran after failed


def _ends_by(j: Job) -> float | None:
    if j.started_at is None:
        return None
    limit = json.loads(j.spec_json).get("time_limit")
    return None if limit is None else j.started_at + parse_duration(limit)


def running_now(store: Store) -> list[Running]:
    """Active jobs, and the idle clusters team members launched (they count against the
    team's quota, as `lifecycle.held` says, and free nothing the plan can foresee)."""
    with store.read() as s:
        found = s.execute(select(Job, Cluster).join(Cluster, Cluster.id == Job.cluster_id)
                          .where(Job.status.in_(jobs.ACTIVE))).all()
        busy = {c.id for _, c in found}
        member = {n: t for n, t in s.execute(select(User.name, User.team)) if t is not None}
        idle = [c for c in s.scalars(select(Cluster).where(Cluster.status.in_(CLUSTER_ACTIVE),
                                                           Cluster.user.is_not(None)))
                if c.id not in busy and member.get(c.user or "")]
    out = [Running(j.name, j.user or "-", j.team, (c.pool or "local", c.gpu), c.count,
                   j.started_at or j.created_at, _ends_by(j),
                   c.name if c.for_job != j.name else None) for j, c in found]
    out += [Running(f"cluster {c.name}", c.user or "-", member[c.user or ""],
                    (c.pool or "local", c.gpu), c.count, c.started_at or c.created_at, None,
                    idle=True)
            for c in idle]
    return out


def recent_use(store: Store, now: float) -> dict[str, float]:
    with store.read() as s:
        found = s.execute(select(Job.user, Cluster.count, Job.started_at, Job.ended_at)
                          .join(Cluster, Cluster.id == Job.cluster_id)
                          .where(Job.started_at.is_not(None),
                                 (Job.ended_at.is_(None)) | (Job.ended_at >= now - USE_WINDOW_S)))
        uses = [Use(user or "-", count, start, end) for user, count, start, end in found
                if start is not None]
    return recent_gpu_hours(uses, now)


class Inventory:
    """The pools' devices for one pass: discovered once per (pool, CPU slots), with what is
    reserved, as allocators that take what the plan starts. A pool that cannot be seen now
    (removed, or its Ray cluster unreachable) has no devices this pass, and `problems` says why:
    its jobs wait, and the other pools' queues go on."""

    def __init__(self, store: Store):
        self.store = store
        self.allocators: dict[tuple[str, int | None], Allocator] = {}
        self.problems: dict[str, str] = {}

    def allocator(self, pool: str, cpu_slots: int | None) -> Allocator:
        key = (pool, cpu_slots)
        if key not in self.allocators:
            try:
                prow = None if pool == "local" else pools.get(self.store, pool)
                nodes = pools.backend_for(prow, cpu_slots).discover()
            except GpufleetError as exc:
                self.problems[pool] = str(exc)
                self.allocators[key] = Allocator([])
                return self.allocators[key]
            held, whole = pools.held_on(self.store, prow.name if prow else None)
            self.allocators[key] = Allocator(nodes, held, whole)
        return self.allocators[key]

    def free(self, pool: str, gpu: str, cpu_slots: int | None) -> int:
        a = self.allocator(pool, cpu_slots)
        return sum(len(st.free) for (_, g), st in a.state.items()
                   if g == gpu and st.exclusive is None and st.node.healthy)


def _fits(inv: Inventory, specs: dict[str, tuple[ClusterSpec | None, int | None]]
          ) -> Callable[[Waiting], bool]:
    def fits(w: Waiting) -> bool:
        cspec, slots = specs[w.name]
        if cspec is None:
            return True  # a whole existing cluster: the plan checked it has no job
        a = inv.allocator(w.resource[0], slots)
        local = w.resource[0] == "local"
        try:
            alloc = a.allocate(cspec.gpu, cspec.count, cspec.node_count if local else cspec.nodes,
                               cspec.fabric if local else cspec.network)
        except AllocationError:
            return False
        a.take(w.name, alloc)
        return True

    return fits


def dispatch(store: Store, now: float | None = None) -> Pass:
    """Plan the queue, start what may start, record the rest's place and reason."""
    now = time.time() if now is None else now
    entries = {e.name: e for e in _queued(store)}
    if not entries:
        return Pass(Plan((), ()))
    specs: dict[str, tuple[ClusterSpec | None, int | None]] = {}
    parsed: dict[str, JobSpec] = {}
    for e in list(entries.values()):
        try:
            spec = JobSpec.model_validate_json(e.spec_json)
        except ValueError as exc:  # stored by a version whose spec this one cannot read
            _refuse(store, e, f"its spec cannot be read by this version: {exc}", now)
            del entries[e.name]
            continue
        parsed[e.name] = spec
        specs[e.name] = (spec.cluster if isinstance(spec.cluster, ClusterSpec) else None,
                         e.cpu_slots)
    inv = Inventory(store)
    free: dict[Resource, int] = {}
    for e in entries.values():
        if (e.pool, e.gpu) not in free:
            free[(e.pool, e.gpu)] = inv.free(e.pool, e.gpu, e.cpu_slots)
    limits = limits_now(store, now)
    for e in list(entries.values()):  # a limit lowered under it since it was queued
        never = admit.never_fits(waiting_of(e), limits)
        if never:
            _refuse(store, e, f"it can no longer start: {never.split(': ', 1)[1]}", now)
            del entries[e.name]
    states = depends.states(store, (e.after for e in entries.values()))
    decided = scheduler.plan([waiting_of(e) for e in entries.values()], running_now(store), free,
                             _fits(inv, specs), limits, recent_use(store, now), now,
                             states=states)
    done = Pass(decided)
    for gone in decided.cancels:  # what they run after can no longer succeed
        _cancel(store, entries[gone.name], gone.text, now)
        done.cancelled[gone.name] = gone.text
    for start in decided.starts:
        e = entries[start.name]
        why = _start(store, e, parsed[e.name], start.backfilled, now)
        if why is None:
            done.started.append(e.name)
        elif why:
            done.refused[e.name] = why
    texts = {h.name: h.text if entries[h.name].pool not in inv.problems else
             f"pool {entries[h.name].pool} cannot be used now: {inv.problems[entries[h.name].pool]}"
             for h in decided.held}
    changed = [h for h in decided.held if (entries[h.name].wait, entries[h.name].reason,
                                           entries[h.name].position, entries[h.name].est_start,
                                           entries[h.name].start_note)
               != (h.wait.value, texts[h.name], h.position, h.est_start, h.unknown)]
    if changed:
        # only what changed (a pass that changes nothing writes nothing: no write lock, no
        # fsync), in one statement (an ORM update each cost ~0.4 ms: 40 ms a pass for a queue
        # of 100); only rows still queued, so a cancel that came first wins
        q = QueuedJob.metadata.tables[QueuedJob.__tablename__]
        held = (update(q).where(q.c.name == bindparam("n"), q.c.status == QueueStatus.QUEUED)
                .values(wait=bindparam("w"), reason=bindparam("r"), position=bindparam("p"),
                        est_start=bindparam("e"), start_note=bindparam("u"), decided_at=now))
        with store.session() as s:
            s.connection().execute(held, [
                {"n": h.name, "w": h.wait.value, "r": texts[h.name], "p": h.position,
                 "e": h.est_start, "u": h.unknown} for h in changed])
    return done


def _queued(store: Store) -> list[QueuedJob]:
    with store.read() as s:
        return list(s.scalars(select(QueuedJob).where(QueuedJob.status == QueueStatus.QUEUED)
                              .order_by(QueuedJob.id)))


def _start(store: Store, e: QueuedJob, spec: JobSpec, backfilled: bool,
           now: float) -> str | None:
    """Start a queued job: None when it started, "" when its devices went to someone else a
    moment ago (it stays queued), else why it can never start (it leaves the queue)."""
    with store.session() as s:  # claim it: a cancel that came first wins
        claimed = s.execute(update(QueuedJob).where(QueuedJob.id == e.id,
                                                    QueuedJob.status == QueueStatus.QUEUED)
                            .values(status=QueueStatus.STARTED, left_at=now,
                                    reason="backfilled: ends before the next job needs its "
                                    "devices" if backfilled else None))
        if getattr(claimed, "rowcount", 1) == 0:
            return ""
    try:
        result = submit.submit(store, spec, lambda _offer: None, e.cpu_slots,
                               owner=(e.user, e.team), from_queue=True)
        assert isinstance(result, tuple)
        job, _cluster = result
    except (AllocationError, ConflictError) as exc:
        if _busy_error(exc):
            _requeue(store, e.id)
            return ""
        return _refuse(store, e, str(exc), now)
    except GpufleetError as exc:
        return _refuse(store, e, str(exc), now)
    except Exception:  # not the job's fault (the store, the file system): try again later
        if jobs.get_or_none(store, e.name) is None:
            _requeue(store, e.id)
        raise
    try:
        jobs.add_event(store, job.id, "queued",
                       f"submitted by {e.user}; waited {now - e.submitted_at:.0f}s in the queue"
                       + (", then backfilled" if backfilled else ""), t=e.submitted_at)
        runs.start_detached(store, job, e.cpu_slots,
                            None if e.env_json is None else json.loads(e.env_json))
    except runs.NotStarted as exc:  # the job is failed and its devices freed
        with store.session() as s:
            accounts.audit(s, "gpufleet", "refuse", e.name, exc.why, now)
        return exc.why
    except Exception as exc:  # no supervisor: the job ends here, or it holds its devices forever
        return _not_started(store, e, job, f"its supervisor could not start: {exc}", now)
    _forget_env(store, e.id)
    with store.session() as s:
        waited = now - e.submitted_at
        accounts.audit(s, "gpufleet", "start", e.name,
                       f"after {waited:.0f}s in the queue{', backfilled' if backfilled else ''}",
                       now)
    return None


def _not_started(store: Store, e: QueuedJob, job: Job, why: str, now: float) -> str:
    """The job record exists but nothing runs it: it fails with the reason (its entry stays
    `started`: the job's row tells the rest) and a cluster made for it is freed. The server
    that made it lives on, so `reconcile` would never see it as orphaned."""
    jobs.transition(store, job.id, JobStatus.FAILED, why, expect=(JobStatus.STARTING,))
    reconcile.free_own_cluster(store, job, keep=False)
    with store.session() as s:
        accounts.audit(s, "gpufleet", "refuse", e.name, why, now)
    return why


def _busy_error(exc: GpufleetError) -> bool:
    """Lost a race for what the plan saw free (devices, a cluster, the team's quota): the job
    waits for the next pass."""
    return isinstance(exc, AllocationError | LimitError) or "is busy with job" in str(exc)


def _forget_env(store: Store, entry_id: int) -> None:
    """The submitter's environment is kept only until the job starts (or leaves the queue)."""
    with store.session() as s:
        s.execute(update(QueuedJob).where(QueuedJob.id == entry_id).values(env_json=None))


def requeue_unstarted(store: Store) -> list[str]:
    """Entries claimed by a server that died before it made their job record: queued again
    (called when a server starts, before its first pass)."""
    with store.session() as s:
        claimed = list(s.scalars(select(QueuedJob).where(QueuedJob.status == QueueStatus.STARTED)))
        names = {n for (n,) in s.execute(select(Job.name).where(
            Job.name.in_([e.name for e in claimed])))}
        back = [e for e in claimed if e.name not in names]
        for e in back:
            e.status, e.left_at, e.reason = QueueStatus.QUEUED, None, None
    return [e.name for e in back]


def _requeue(store: Store, entry_id: int) -> None:
    with store.session() as s:
        s.execute(update(QueuedJob).where(QueuedJob.id == entry_id)
                  .values(status=QueueStatus.QUEUED, left_at=None, reason=None))


def _cancel(store: Store, e: QueuedJob, why: str, now: float) -> None:
    """Out of the queue for good, with the reason (a cancel or a start that came first wins)."""
    with store.session() as s:
        done = s.execute(update(QueuedJob).where(QueuedJob.id == e.id,
                                                 QueuedJob.status == QueueStatus.QUEUED)
                         .values(status=QueueStatus.CANCELLED, reason=f"cancelled: {why}",
                                 left_at=now, env_json=None))
        if getattr(done, "rowcount", 1):
            accounts.audit(s, "gpufleet", "cancel", e.name, why, now)


def _refuse(store: Store, e: QueuedJob, why: str, now: float) -> str:
    with store.session() as s:
        s.execute(update(QueuedJob).where(QueuedJob.id == e.id)
                  .values(status=QueueStatus.REFUSED, reason=why, left_at=now, env_json=None))
        accounts.audit(s, "gpufleet", "refuse", e.name, why, now)
    return why

