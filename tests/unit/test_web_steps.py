"""The dashboard's step axis (web/data.py): each chart sample placed at the step its rank had
reported by then, device and job samples at rank 0's, nothing guessed before the first report."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.store import Metric, Store
from gpufleet.telemetry.schema import STEP_METRIC
from gpufleet.web import data


def test_step_at_takes_the_last_report_at_or_before() -> None:
    steps = [(10.0, 1.0), (11.0, 2.0), (12.5, 3.0)]
    assert data.step_at(steps, 9.9) is None
    assert data.step_at(steps, 10.0) == 1.0  # a report's own samples share its time
    assert data.step_at(steps, 12.4) == 2.0
    assert data.step_at(steps, 99.0) == 3.0
    assert data.step_at([], 5.0) is None


def test_rank_of_labels() -> None:
    assert data.rank_of("rank 3") == 3
    assert data.rank_of("job") == 0
    assert data.rank_of("cpu1") == 0
    assert data.rank_of("node-a/gpu2") == 0


def test_attach_steps_uses_each_ranks_own_steps_and_drops_the_step_series() -> None:
    series = {
        "lr": {"rank 0": [(10.0, 0.1), (11.0, 0.05)], "rank 1": [(10.2, 0.1)]},
        "gpu_utilization": {"cpu0": [(9.0, 0.5), (11.5, 0.7)]},
        STEP_METRIC: {"rank 0": [(10.0, 1.0)]},
    }
    steps = {0: [(10.0, 1.0), (11.0, 2.0)], 1: [(10.2, 5.0)]}
    out = data.attach_steps(series, steps)
    assert STEP_METRIC not in out
    assert out["lr"]["rank 0"] == [(10.0, 0.1, 1.0), (11.0, 0.05, 2.0)]
    assert out["lr"]["rank 1"] == [(10.2, 0.1, 5.0)]  # rank 1's own step, not rank 0's
    assert out["gpu_utilization"]["cpu0"] == [(9.0, 0.5, None), (11.5, 0.7, 2.0)]


def test_a_restarted_run_takes_no_step_from_the_run_before() -> None:
    """Run 1 reached step 8; run 2 (started at 20.0, from step 1 again) reports first at 24.0:
    a device sample at 22.0 has no step yet, not run 1's 8; one at 25.0 takes run 2's 1."""
    series = {"gpu_utilization": {"cpu0": [(15.0, 0.5), (22.0, 0.6), (25.0, 0.7)]},
              "loss": {"rank 0": [(24.0, 3.0)]}}
    steps = {0: [(10.0, 1.0), (14.0, 8.0), (24.0, 1.0)]}
    out = data.attach_steps(series, steps, starts=[5.0, 20.0])
    assert out["gpu_utilization"]["cpu0"] == [(15.0, 0.5, 8.0), (22.0, 0.6, None),
                                              (25.0, 0.7, 1.0)]
    assert out["loss"]["rank 0"] == [(24.0, 3.0, 1.0)]
    assert data.attach_steps(series, steps)["gpu_utilization"]["cpu0"][1] == (22.0, 0.6, 8.0)
    assert (data.run_start([5.0, 20.0], 4.0), data.run_start([5.0, 20.0], 20.0)) == (
        float("-inf"), 20.0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def _rows(job: str, rank: int, name: str, points: list[tuple[float, float]]) -> list[Metric]:
    return [Metric(time=t, cluster="c", job=job, node="local", rank=rank, name=name, value=v)
            for t, v in points]


def test_steps_since_keeps_each_ranks_last_report_before_the_window(store: Store) -> None:
    with store.session() as s:
        s.add_all(_rows("j", 0, STEP_METRIC, [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]))
        s.add_all(_rows("j", 1, STEP_METRIC, [(1.5, 1.0), (4.0, 2.0)]))
        s.add_all(_rows("other", 0, STEP_METRIC, [(2.5, 50.0)]))
        s.add_all(_rows("j", 0, "loss", [(2.5, 9.0)]))
    got = data.steps_since(store, "j", 2.5)
    # rank 0: step 2 (at 2.0) is its last before 2.5, then step 3; rank 1: 1 then 2
    assert got == {0: [(2.0, 2.0), (3.0, 3.0)], 1: [(1.5, 1.0), (4.0, 2.0)]}
    assert data.steps_since(store, "j", 0.0) == {0: [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)],
                                                 1: [(1.5, 1.0), (4.0, 2.0)]}
    assert data.steps_since(store, "none", 0.0) == {}
