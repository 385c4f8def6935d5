"""Judging an elastic resize by what it did to goodput, and holding off what hurt. Pure.

Utilization only says when to *try* a resize (`elastic.decide`): on a shared host low
utilization is as often contention as too many workers, and there a shrink makes the job
slower and dearer. So every resize is a trial: its goodput is measured over a window before
the save request and a window after the resized run has settled, and a resize that lowered the
samples per dollar by more than the job's tolerance (`--scale-tolerance`, default 10%) is
reverted, and that direction held off for a while.

The windows, both W = `Policy.window_s` (the cooldown, at most 30 s) long:

- before: the last W seconds of rank 0's reports up to the save request. The policy decides
  nothing within a cooldown of the run's first report, so this is a settled speed.
- after: starting one cooldown after the resized run's first report, and W long. The cooldown is
  the settling time the user gives a start or a resize (it already keeps the policy quiet for
  as long); here it keeps the restart's warm-up (the checkpoint load, the first slow steps,
  caches filling) out of the figure, so both windows measure a settled run over the same span.

A window must hold at least `MIN_STEPS` steps: with slow steps the before window reaches further
back, and the verdict waits for more.

Goodput is samples/s when every report in both windows says its samples, else steps/s (an
elastic job's global batch is fixed, so the two are proportional). Samples per dollar is the
samples/s over the cost of the workers in use (the cluster's rate per device times the
workers); as the rate per device does not change with the size, its change equals the change
in samples per worker-second, which is what a pool without prices is judged by.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NamedTuple

MIN_STEPS = 3  # steps a window must span for its rate to mean anything
DEFAULT_TOLERANCE = 0.1  # a resize may cost this share of the samples per dollar
HOLDOFF_MIN_S = 300.0  # the shortest hold-off after a verdict
HOLDOFF_COOLDOWNS = 10  # the hold-off is this many cooldowns, when that is longer
HOLDOFF_MAX_DOUBLINGS = 3  # a direction reverted again and again waits at most 8x as long


class Mark(NamedTuple):
    """One report of rank 0 in the current run of the workers."""

    t: float  # UNIX seconds, the worker's clock
    step: int
    samples: int | None  # the run's samples so far; None: the script does not say


class Direction(StrEnum):
    GROW = "grow"
    SHRINK = "shrink"

    @property
    def doing(self) -> str:
        return "growing" if self is Direction.GROW else "shrinking"


def direction(before: int, after: int) -> Direction:
    return Direction.GROW if after > before else Direction.SHRINK


class Verdict(StrEnum):
    KEPT = "kept"
    REVERTED = "reverted"

    @property
    def event(self) -> str:
        """The job event's kind: resize_kept or resize_reverted."""
        return f"resize_{self.value}"


@dataclass(frozen=True)
class Goodput:
    """A window's throughput at one size."""

    workers: int
    steps_per_s: float
    samples_per_s: float | None  # None: some report in the window had no samples
    usd_per_hour: float  # the workers in use: the rate per device times `workers`; 0: no price


@dataclass(frozen=True)
class Trial:
    """A resize asked for, waiting for its verdict."""

    before: Goodput
    target: int
    trigger: str  # why it was tried: the utilization, or growing back


@dataclass(frozen=True)
class Holds:
    """Until when (UNIX seconds) each direction is held off, and how many resizes in a row
    each direction had reverted (the hold-off doubles with each)."""

    grow_until: float = 0.0
    shrink_until: float = 0.0
    grow_reverts: int = 0
    shrink_reverts: int = 0

    def until(self, d: Direction) -> float:
        return self.grow_until if d is Direction.GROW else self.shrink_until

    def reverts(self, d: Direction) -> int:
        return self.grow_reverts if d is Direction.GROW else self.shrink_reverts

    def left_s(self, d: Direction, now: float) -> float:
        return max(0.0, self.until(d) - now)


@dataclass(frozen=True)
class Judgement:
    """A verdict with its figures, as the job's event and diagnosis tell it."""

    before: Goodput
    after: Goodput
    verdict: Verdict
    tolerance: float
    held: Direction  # the direction the verdict holds off
    hold_s: float
    at: float
    trigger: str = ""  # why the resize was tried (Trial.trigger)

    @property
    def unit(self) -> str:
        return "samples/s" if _by_samples(self.before, self.after) else "steps/s"

    @property
    def speed_change(self) -> float:
        """after / before - 1 of the throughput."""
        return _rate(self.after, self.before) / _rate(self.before, self.after) - 1

    @property
    def per_usd_change(self) -> float:
        """after / before - 1 of the samples per dollar (equally, per worker-second)."""
        return (self.speed_change + 1) * self.before.workers / self.after.workers - 1

    @property
    def summary(self) -> str:
        """'throughput fell 82%, samples per $ -64%'"""
        per = "samples per $" if self.before.usd_per_hour > 0 else "per worker"
        return f"throughput {_moved(self.speed_change)}, {per} {_signed(self.per_usd_change)}"

    @property
    def text(self) -> str:
        b, a = self.before, self.after
        size = f"{b.workers} -> {a.workers}"
        speed = f"{_num(_rate(b, a))} -> {_num(_rate(a, b))} {self.unit}"
        per = f"{_signed(self.per_usd_change)}"
        if b.usd_per_hour > 0 and a.usd_per_hour > 0:
            unit = "samples" if self.unit == "samples/s" else "steps"
            per = f"{unit} per $ {_num(per_usd(b, a))} -> {_num(per_usd(a, b))}, {per}"
        else:
            per = f"per worker {per}"
        if self.verdict is Verdict.REVERTED:
            why = f"more than the {self.tolerance:.0%} tolerance"
            then = f"reverted to {b.workers}"
        else:
            why = f"within the {self.tolerance:.0%} tolerance" if self.per_usd_change < 0 else ""
            then = f"kept {a.workers}"
        return (f"throughput {_moved(self.speed_change)} after {size} ({speed}; {per}"
                f"{', ' + why if why else ''}); {then}; no {self.held.doing} for "
                f"{_duration(self.hold_s)}")


def measure(marks: tuple[Mark, ...], workers: int, usd_per_device_hour: float,
            start: float, end: float, reach_back: bool = False) -> Goodput | None:
    """The goodput of the reports from `start` to `end`; None with fewer than MIN_STEPS steps
    there. `reach_back`: with too few, take the last MIN_STEPS steps before `end` instead."""
    upto = [m for m in marks if m.t <= end]
    window = [m for m in upto if m.t >= start]
    if reach_back and (not window or window[-1].step - window[0].step < MIN_STEPS):
        window = [m for m in upto if upto and m.step >= upto[-1].step - MIN_STEPS]
    if len(window) < 2 or window[-1].step - window[0].step < MIN_STEPS:
        return None
    first, last = window[0], window[-1]
    dt = last.t - first.t
    if dt <= 0:
        return None
    samples = None  # a window without samples counted is judged by its steps
    if all(m.samples is not None for m in window) and (last.samples or 0) > (first.samples or 0):
        samples = ((last.samples or 0) - (first.samples or 0)) / dt
    return Goodput(workers, (last.step - first.step) / dt, samples,
                   usd_per_device_hour * workers)


def after_window(since: float, cooldown_s: float, window_s: float) -> tuple[float, float]:
    """(start, due) of the after window of a run whose first report came at `since`."""
    return since + cooldown_s, since + cooldown_s + window_s


def judge(trial: Trial, after: Goodput, tolerance: float, holds: Holds, cooldown_s: float,
          now: float) -> tuple[Judgement, Holds]:
    """Keep a resize unless it lowered the samples per dollar by more than `tolerance`; the
    hold-offs it sets: a reverted direction waits (longer each time in a row), and after a
    kept one the way back waits too, so a flat series does not flap."""
    tried = direction(trial.before.workers, after.workers)
    base = max(HOLDOFF_MIN_S, HOLDOFF_COOLDOWNS * cooldown_s)
    j = Judgement(trial.before, after, Verdict.KEPT, tolerance, tried, base, now, trial.trigger)
    if j.per_usd_change < -tolerance - 1e-9:
        n = holds.reverts(tried) + 1
        hold = base * 2 ** min(n - 1, HOLDOFF_MAX_DOUBLINGS)
        return replace(j, verdict=Verdict.REVERTED, hold_s=hold), _hold(holds, tried, now + hold, n)
    back = Direction.SHRINK if tried is Direction.GROW else Direction.GROW
    holds = _hold(holds, tried, holds.until(tried), 0)
    return replace(j, held=back), _hold(holds, back, max(holds.until(back), now + base),
                                        holds.reverts(back))


def _hold(holds: Holds, d: Direction, until: float, reverts: int) -> Holds:
    if d is Direction.GROW:
        return replace(holds, grow_until=until, grow_reverts=reverts)
    return replace(holds, shrink_until=until, shrink_reverts=reverts)


def per_usd(g: Goodput, other: Goodput) -> float:
    """Samples (or steps, when either side lacks samples) per dollar."""
    return _rate(g, other) * 3600 / g.usd_per_hour if g.usd_per_hour > 0 else 0.0


def describe(g: Goodput) -> str:
    """'413 samples/s (16.7M samples per $) on 2': a before figure for the resizing event."""
    unit = "samples" if g.samples_per_s is not None else "steps"
    rate = g.samples_per_s if g.samples_per_s is not None else g.steps_per_s
    per = f" ({_num(rate * 3600 / g.usd_per_hour)} {unit} per $)" if g.usd_per_hour > 0 else ""
    return f"{_num(rate)} {unit}/s{per} on {g.workers}"


def _by_samples(a: Goodput, b: Goodput) -> bool:
    return a.samples_per_s is not None and b.samples_per_s is not None


def _rate(g: Goodput, other: Goodput) -> float:
    return g.samples_per_s if _by_samples(g, other) and g.samples_per_s is not None \
        else g.steps_per_s


def _moved(change: float) -> str:
    if abs(change) < 0.005:
        return "held"
    return f"{'rose' if change > 0 else 'fell'} {abs(change):.0%}"


def _signed(change: float) -> str:
    return f"{change:+.0%}"


def _num(v: float) -> str:
    """413, 74.2, 16.7M: about three significant figures, the units of a count."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")):
        if abs(v) >= div or div == 1.0:
            x = v / div
            return f"{x:.0f}{suffix}" if abs(x) >= 99.5 else \
                f"{x:.1f}{suffix}" if abs(x) >= 9.95 else f"{x:.2f}{suffix}"
    raise AssertionError("unreachable")


def _duration(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:g}h"
    return f"{s / 60:g}m" if s >= 60 else f"{s:g}s"
