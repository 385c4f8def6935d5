"""The last minutes of a job's samples, in the supervisor's memory, for the diagnosis rules."""

from __future__ import annotations

import threading
from collections import deque

from gpufleet.telemetry.diagnose import Series


class Recent:
    """Samples per (name, key) in a sliding window; the rules read a snapshot of it.

    The sampler thread adds device samples while the supervisor's loop adds reports and takes
    snapshots, so every access holds a lock.
    """

    def __init__(self, span_s: float = 120.0):
        self.span_s = span_s
        self._series: dict[str, dict[int, deque[tuple[float, float]]]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, key: int, t: float, value: float) -> None:
        with self._lock:
            points = self._series.setdefault(name, {}).setdefault(key, deque())
            points.append((t, value))
            while points and t - points[0][0] > self.span_s:
                points.popleft()

    def snapshot(self, now: float) -> Series:
        cut = now - self.span_s
        with self._lock:
            return {name: {key: [p for p in pts if p[0] >= cut] for key, pts in by_key.items()}
                    for name, by_key in self._series.items()}
