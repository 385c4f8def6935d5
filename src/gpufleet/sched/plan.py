"""One pass of the queue: what starts now and, for what waits, why, its place and a likely
start time.

The rules, in the order they decide for each job (jobs taken in `order.ordered` order):
- a job run after one that can no longer succeed leaves the queue (`after.doomed`);
- a held job (gpufleet hold), and one whose `--after` job has not succeeded yet, waits with
  that reason and holds up no one; it keeps its place in the order for when it may start;
- a job over its team's quota or budget waits with that reason and holds up no one;
- a job on an existing cluster starts when that cluster has no job;
- otherwise the first job of a (pool, GPU type) that does not fit becomes that resource's head:
  it gets a start time from the running jobs' time limits (its "shadow" time), and the devices
  that will be spare then;
- a job behind a head starts now only if its whole gang fits and it cannot delay the head:
  it ends (by its time limit) before the head's shadow time, or it takes only the spare devices
  (EASY backfill). Without a time limit on the jobs the head waits for, nothing jumps it.

Estimated starts assume every job runs to its time limit (one past it ends now); a job without
one never frees its devices in the estimate, so what waits for them has no estimate (None). A job
on an existing cluster frees no devices when it ends: the cluster keeps them. A job behind a head
is estimated after every decision of the pass, so a later backfill's devices count against it.
Where there is no estimate, `Held.unknown` says why in words, from what holds the devices: a
running job without a time limit, a job ahead without one, a launched cluster (which frees its
devices only when stopped), the team's limits, a hold, a dependency.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpufleet.sched import admit
from gpufleet.sched import after as deps
from gpufleet.sched.model import (
    Cancel,
    Fits,
    Held,
    Limits,
    Plan,
    Resource,
    Running,
    Start,
    Wait,
    Waiting,
)
from gpufleet.sched.order import WEIGHT_S_PER_GPU_HOUR, ordered
from gpufleet.slot_words import devices_shown

INF = float("inf")
NO_LIMIT = "unknown (a running job has no --time-limit)"
AHEAD_NO_LIMIT = "unknown (a job ahead of it has no --time-limit)"
CLUSTER_HOLDS = "unknown (a launched cluster holds the devices until it is stopped)"
NO_END = "unknown (nothing that holds its devices has an end time)"


@dataclass
class _Timeline:
    """Devices of one resource over time: free now, freed by known ends, taken by what is
    planned to start later. Counting only (the allocator answers whether a gang fits now)."""

    free_now: int
    releases: list[tuple[float, int]] = field(default_factory=list)  # (time, devices freed)
    blocks: list[tuple[float, float, int]] = field(default_factory=list)  # planned (start, end, n)

    def free_at(self, t: float) -> int:
        freed = sum(n for at, n in self.releases if at <= t)
        taken = sum(n for s, e, n in self.blocks if s <= t < e)
        return self.free_now + freed - taken

    def earliest(self, count: int, not_before: float, duration: float | None) -> float | None:
        """The first time from `not_before` at which `count` devices stay free for `duration`
        (to the end of the timeline when unknown)."""
        points = sorted({not_before, *(t for t, _ in self.releases if t > not_before),
                         *(e for _, e, _ in self.blocks if not_before < e < INF)})
        for t in points:
            end = INF if duration is None else t + duration
            checks = [t, *(s for s, _, _ in self.blocks if t < s < end)]
            if all(self.free_at(c) >= count for c in checks):
                return t
        return None


@dataclass
class _Head:
    name: str
    shadow: float | None  # when the head is expected to start; None: cannot be told
    spare: int  # devices free at the shadow time beyond what the head needs
    unknown: str | None  # why the shadow time cannot be told
    position: int = 0  # its place among the waiting jobs (named by place, not by name: a
    # user may see the reasons of their own jobs, not the names of others')


def plan(waiting: Sequence[Waiting], running: Sequence[Running], free: Mapping[Resource, int],
         fits: Fits, limits: Limits, usage: Mapping[str, float], now: float,
         weight_s: float = WEIGHT_S_PER_GPU_HOUR,
         states: Mapping[str, str | None] | None = None) -> Plan:
    """Decide one pass. `free`: devices of each resource free now; `usage`: each user's recent
    GPU-hours (`order.recent_gpu_hours`); `states`: the status of each job a waiting job runs
    after (`after.doomed`)."""
    states = {**(states or {}), **{w.name: "queued" for w in waiting}}
    doomed = deps.doomed(waiting, states)
    in_use: dict[tuple[str, str], int] = {}
    for r in running:
        if r.team is not None:
            key = (r.team, r.resource[1])
            in_use[key] = in_use.get(key, 0) + r.count
    left = dict(limits.budget_left)
    lines: dict[Resource, _Timeline] = {}

    def line(res: Resource) -> _Timeline:
        if res not in lines:
            lines[res] = _Timeline(max(0, free.get(res, 0)))
        return lines[res]

    cluster_free_at: dict[str, float | None] = {}
    cluster_unknown: dict[str, str] = {}  # why a cluster's free time cannot be told
    for r in running:
        ends = None if r.ends_by is None else max(r.ends_by, now)  # past its limit: being stopped
        if r.cluster is not None:  # an existing cluster keeps its devices after the job
            cluster_free_at[r.cluster] = ends
            cluster_unknown[r.cluster] = NO_LIMIT
        elif ends is not None:
            line(r.resource).releases.append((ends, r.count))
    heads: dict[Resource, _Head] = {}
    endless: set[Resource] = set()  # resources a job started in this pass holds with no limit
    starts: list[Start] = []
    held: list[Held] = []
    behind: list[tuple[int, Waiting, _Head]] = []  # estimated once every start is decided

    def started(w: Waiting, backfilled: bool = False) -> None:
        starts.append(Start(w.name, backfilled))
        if w.team is not None:
            key = (w.team, w.resource[1])
            in_use[key] = in_use.get(key, 0) + w.count
            if w.team in left and w.duration_s is not None:
                left[w.team] -= w.usd_per_hour * w.duration_s / 3600.0
        if w.cluster is not None:
            cluster_free_at[w.cluster] = None if w.duration_s is None else now + w.duration_s
            cluster_unknown[w.cluster] = NO_LIMIT
            return
        tl = line(w.resource)
        tl.free_now = max(0, tl.free_now - w.count)  # `fits` may find what the counts missed
        if w.duration_s is not None:
            tl.releases.append((now + w.duration_s, w.count))
        else:
            endless.add(w.resource)

    def hold(w: Waiting, wait: Wait, text: str, est: float | None,
             unknown: str | None = None) -> None:
        held.append(Held(w.name, wait, text, len(held) + 1, est,
                         None if est is not None else unknown))

    def no_end(res: Resource, tl: _Timeline) -> str:
        """Why a job waiting for `res` gets no estimate: what holds the devices never ends."""
        holders = [r for r in running if r.resource == res and
                   (r.ends_by is None or r.cluster is not None)]
        if res in endless or any(not r.idle and r.cluster is None for r in holders):
            return NO_LIMIT
        if any(s < INF and e == INF for s, e, _ in tl.blocks):
            return AHEAD_NO_LIMIT
        return CLUSTER_HOLDS if holders else NO_END

    for w in ordered(waiting, usage, weight_s):
        if w.name in doomed:
            continue
        if w.held:
            hold(w, Wait.HELD, f"held: it keeps its place but starts only after gpufleet "
                 f"release {w.name}", None, "held")
            continue
        if w.after is not None and not deps.ready(states.get(w.after)):
            hold(w, Wait.AFTER, deps.waiting_text(w.after, states.get(w.after)), None,
                 f"after {w.after}")
            continue
        problem = admit.quota_problem(w, in_use, limits)
        if problem:
            hold(w, Wait.QUOTA, problem, None, "unknown (its team's quota is in use)")
            continue
        problem = admit.budget_problem(w, left, limits)
        if problem:
            hold(w, Wait.BUDGET, problem, None, "unknown (its team's budget)")
            continue
        if w.cluster is not None:
            if w.cluster in cluster_free_at:
                est = cluster_free_at[w.cluster]
                hold(w, Wait.CLUSTER, f"cluster {w.cluster} is running another job", est,
                     cluster_unknown.get(w.cluster, NO_LIMIT))
                if est is not None and w.duration_s is not None:
                    cluster_free_at[w.cluster] = est + w.duration_s
                else:
                    if est is not None:
                        cluster_unknown[w.cluster] = AHEAD_NO_LIMIT
                    cluster_free_at[w.cluster] = None
                continue
            started(w)
            continue
        tl = line(w.resource)
        head = heads.get(w.resource)
        if head is None:
            if fits(w):
                started(w)
                continue
            shadow = tl.earliest(w.count, now, w.duration_s)
            if shadow is not None and tl.free_now >= w.count:
                # enough free now by count, but not in one gang shape: the next end may make one
                later = sorted(t for t, _ in tl.releases if t >= now)
                shadow = later[0] if later else None
            spare = tl.free_at(shadow) - w.count if shadow is not None else 0
            why = None if shadow is not None else no_end(w.resource, tl)
            heads[w.resource] = _Head(w.name, shadow, max(0, spare), why, len(held) + 1)
            _reserve(tl, shadow, w)
            hold(w, Wait.DEVICES, f"waits for {devices_shown(w.resource[1], w.count)} to be free "
                 f"({tl.free_now} free now)", shadow, why)
            continue
        ends_in_time = (head.shadow is not None and w.duration_s is not None
                        and now + w.duration_s <= head.shadow)
        in_spare = head.shadow is not None and w.count <= head.spare
        if (ends_in_time or in_spare) and fits(w):
            if not ends_in_time:
                head.spare -= w.count
            started(w, backfilled=True)
            continue
        behind.append((len(held), w, head))
        hold(w, Wait.BEHIND, f"behind the job at position {head.position}, which is next "
             f"for {w.resource[1]} devices", None)
    for i, w, head in behind:  # in queue order: each one's estimate comes after those ahead
        tl = line(w.resource)
        est = None if head.shadow is None else tl.earliest(w.count, head.shadow, w.duration_s)
        why = None if est is not None else head.unknown or no_end(w.resource, tl)
        _reserve(tl, est, w)
        held[i] = replace(held[i], est_start=est, unknown=why)
    return Plan(tuple(starts), tuple(held),
                tuple(Cancel(w.name, doomed[w.name]) for w in waiting if w.name in doomed))


def _reserve(tl: _Timeline, at: float | None, w: Waiting) -> None:
    """Count a waiting job's devices as taken from its estimated start, so the estimates of the
    jobs behind it come after it."""
    if at is None:
        tl.blocks.append((INF, INF, w.count))  # no estimate: it keeps nothing in the timeline
        return
    tl.blocks.append((at, INF if w.duration_s is None else at + w.duration_s, w.count))
