"""Progress arithmetic from rank-0 reports: throughput, ETA. Pure: times are passed in."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Report:
    t: float  # UNIX seconds, stamped by the worker
    rank: int
    step: int
    samples: int | None = None
    loss: float | None = None
    total_steps: int | None = None
    samples_total: int | None = None  # the worker's running total: exact even if reports drop


class Throughput:
    """Samples/s and seconds/step over a sliding window of rank 0's recent reports.

    A window (not the whole run) so the number follows the job's current speed; the first report
    is only a time mark, since it includes start-up and the first, slow step.
    """

    def __init__(self, window_s: float = 10.0):
        self.window_s = window_s
        self.points: deque[tuple[float, int, int]] = deque()  # (t, step, cumulative samples)
        self.total_samples = 0
        self.first: tuple[float, int, int] | None = None
        self.saw_samples = False  # a script that never says its samples has no samples/s

    def add(self, r: Report) -> None:
        if r.samples is not None or r.samples_total is not None:
            self.saw_samples = True
        if r.samples_total is not None:
            self.total_samples = r.samples_total
        else:
            self.total_samples += r.samples or 0
        point = (r.t, r.step, self.total_samples)
        if self.first is None:
            self.first = point
        self.points.append(point)
        while len(self.points) > 2 and r.t - self.points[0][0] > self.window_s:
            self.points.popleft()

    def samples_per_s(self) -> float | None:
        if not self.saw_samples or len(self.points) < 2:
            return None
        return _rate(self.points[0], self.points[-1], 2)

    def seconds_per_step(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, s0, _), (t1, s1, _) = self.points[0], self.points[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None

    def overall_samples_per_s(self) -> float | None:
        """Steady throughput over the whole run, excluding the first step."""
        if not self.saw_samples or self.first is None or not self.points or \
                self.points[-1] == self.first:
            return None
        return _rate(self.first, self.points[-1], 2)


def _rate(a: tuple[float, int, int], b: tuple[float, int, int], idx: int) -> float | None:
    dt = b[0] - a[0]
    return (b[idx] - a[idx]) / dt if dt > 0 else None


def eta_seconds(step: int | None, total: int | None, seconds_per_step: float | None) -> float | None:
    if step is None or total is None or seconds_per_step is None:
        return None
    return max(0, total - step) * seconds_per_step
