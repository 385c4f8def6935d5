"""Elastic autoscaling: which world sizes a job may take, and when to move between them. Pure.

The global batch stays fixed: it is the micro-batch times the largest world size, and on w
workers each rank accumulates max/w micro-batches per optimizer step. So the sizes a job can
take are the divisors of its maximum (within the range, and only those its parallel layout
allows), and the loss curve does not notice a resize. Decisions read the mean device
utilization over a window, wait out a cooldown after every change, and never ask for devices
the pool does not have.

Utilization is only the trigger to try a resize; whether it stays is judged by goodput
(`goodput.py`), which also holds off a direction that hurt. A job below the largest size it
ran at grows back when the devices are free, whatever its utilization: one worker of a job
that shrank may never reach the grow threshold, and only a trial tells whether two were
better.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.spec import JobSpec
from gpufleet.supervise.goodput import DEFAULT_TOLERANCE, Direction, Holds


@dataclass(frozen=True)
class Policy:
    min_workers: int
    max_workers: int
    scale_up_util: float  # mean utilization at or above this for a window: grow
    scale_down_util: float  # at or below this: shrink
    cooldown_s: float  # after a start or a resize, before the next decision
    tolerance: float = DEFAULT_TOLERANCE  # share of samples per $ a resize may cost (goodput)

    @property
    def window_s(self) -> float:
        """How much utilization history a decision needs: the cooldown, at most 30 s."""
        return min(30.0, self.cooldown_s)


@dataclass(frozen=True)
class Decision:
    workers: int  # equal to the current size: stay
    reason: str


def sizes(policy: Policy, fits: Callable[[int], bool] = lambda _w: True) -> list[int]:
    """World sizes the job may run at, smallest first: divisors of the maximum in the range
    that the layout accepts."""
    return [w for w in range(policy.min_workers, policy.max_workers + 1)
            if policy.max_workers % w == 0 and fits(w)]


def grad_accum(policy: Policy, workers: int) -> int:
    return policy.max_workers // workers


def decide(policy: Policy, allowed: list[int], workers: int,
           util: list[tuple[float, float]], now: float, since: float, free: int,
           holds: Holds = Holds(), ran_at: int = 0) -> Decision:
    """`util`: (time, mean utilization of the job's devices) samples; `since`: when the workers
    started training after the last start or resize; `free`: devices the job could add;
    `holds`: the directions goodput verdicts hold off; `ran_at`: the largest size the job
    has run at (it grows back to it when the devices are free)."""
    if now - since < policy.cooldown_s:
        return Decision(workers, "cooling down")
    recent = [v for t, v in util if t >= now - policy.window_s]
    if not util or min(t for t, _ in util) > now - policy.window_s + 1.0 or not recent:
        return Decision(workers, "not enough utilization history yet")
    mean = sum(recent) / len(recent)
    eps = 1e-9  # a mean of many 0.9s may come out a hair under 0.9
    bigger = [w for w in allowed if w > workers]
    smaller = [w for w in allowed if w < workers]
    window = f"{policy.window_s:.0f} s"
    if mean >= policy.scale_up_util - eps and bigger:
        why = f"utilization {mean:.2f} >= {policy.scale_up_util:.2f} over {window}"
        return _grow(workers, bigger, free, why, holds, now)
    if mean <= policy.scale_down_util + eps and smaller:
        why = f"utilization {mean:.2f} <= {policy.scale_down_util:.2f} over {window}"
        left = holds.left_s(Direction.SHRINK, now)
        if left > 0:
            return Decision(workers, f"{why}, but shrinking is on hold for {left:.0f} s more")
        return Decision(smaller[-1], why)
    back = [w for w in bigger if w <= ran_at]
    if back:
        return _grow(workers, back, free, f"growing back toward {max(back)}, the size it ran "
                     "at before", holds, now)
    return Decision(workers, f"utilization {mean:.2f} within thresholds")


def _grow(workers: int, bigger: list[int], free: int, why: str, holds: Holds,
          now: float) -> Decision:
    left = holds.left_s(Direction.GROW, now)
    if left > 0:
        return Decision(workers, f"{why}, but growing is on hold for {left:.0f} s more")
    room = [w for w in bigger if w - workers <= free]
    if not room:
        return Decision(workers, f"{why}, but the pool has {free} free device(s) and growing "
                        f"to {bigger[0]} needs {bigger[0] - workers}")
    return Decision(room[0], why)


def elastic_plan(spec: JobSpec, workers: int) -> tuple[Policy | None, list[int], int]:
    """(policy, allowed sizes, first size) of an elastic job; (None, [n], n) otherwise."""
    bounds = spec.worker_range
    if bounds is None:
        return None, [workers], workers
    policy = Policy(bounds[0], bounds[1], spec.scale_up_util, spec.scale_down_util,
                    spec.cooldown_s, spec.scale_tolerance)
    allowed = sizes(policy, lambda w: _fits(spec, w))
    return policy, allowed, max([w for w in allowed if w <= workers] or allowed[:1] or [workers])


def _fits(spec: JobSpec, workers: int) -> bool:
    try:
        spec.layout(workers)
    except ValueError:
        return False
    return True


def mean_utilization(by_device: Mapping[Any, Sequence[tuple[float, float]]],
                     since: float) -> tuple[tuple[float, float], ...]:
    """The mean utilization over the job's devices, per whole second since `since` (training
    started): the series an elastic decision reads."""
    by_time: dict[float, list[float]] = {}
    for points in by_device.values():
        for t, v in points:
            if t >= since:
                by_time.setdefault(round(t), []).append(v)
    return tuple(sorted((t, sum(vs) / len(vs)) for t, vs in by_time.items()))
