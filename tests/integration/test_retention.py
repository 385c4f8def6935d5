"""Downsampling on a real SQLite store: a simulated long job stays small and keeps its means."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select

from gpufleet.store import Metric, Store, retention
from gpufleet.telemetry import records


def _fill(store: Store, start: float, end: float, job: str = "long") -> None:
    """One raw sample a second, inserted in bulk (the supervisor writes a few rows at a time;
    172,800 ORM objects would be most of this test's time)."""
    rows = [{"time": float(t), "cluster": "c", "job": job, "node": "local", "rank": 0,
             "name": "step_time_seconds", "value": t / 1000.0} for t in range(int(start), int(end))]
    with store.session() as s:
        s.execute(insert(Metric), rows)


def test_two_simulated_days_at_one_hertz_stay_within_the_bound(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    t0, day = 1_000_000.0, 86400.0
    # the supervisor compacts every minute; here every 10 simulated minutes, which is harder
    for chunk in range(int(2 * day / 600)):
        a = t0 + chunk * 600
        _fill(store, a, a + 600)
        retention.compact(store, "long", a + 600)
    _fill(store, 0, 100, job="other")  # another job's rows are not touched
    with store.read() as s:
        kept = s.scalar(select(func.count()).where(Metric.job == "long"))
        other = s.scalar(select(func.count()).where(Metric.job == "other"))
    assert kept is not None and kept <= retention.rows_bound(2 * day, compact_every_s=600)
    assert kept < 2 * day / 30  # from 172,800 raw samples
    assert other == 100

    # the value is linear in time, so a bucket's mean value is the value at its mean time
    with store.read() as s:
        for t, value, res in s.execute(select(Metric.time, Metric.value, Metric.resolution)
                                       .where(Metric.job == "long")):
            assert value == pytest.approx(t / 1000.0, rel=1e-9), (t, res)
    # the newest ten minutes are raw, one row a second, for the live charts
    recent = records.series(store, "long", since=t0 + 2 * day - 600, max_points=10_000)
    points = recent["step_time_seconds"]["rank 0"]
    assert len(points) == 599 and all(b - a == 1.0 for (a, _), (b, _) in pairwise(points))


def test_series_thins_long_histories_but_keeps_the_last_point(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    _fill(store, 1, 1001)
    pts = records.series(store, "long", max_points=100)["step_time_seconds"]["rank 0"]
    assert len(pts) <= 101 and pts[0][0] == 1.0 and pts[-1][0] == 1000.0
