"""The calibration file (gpufleet.plan.calibration): round trip, errors, merge, bandwidth lookup
and the CPU compute-rate scaling."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from gpufleet.errors import SpecError
from gpufleet.plan.calibration import (
    KIND,
    VERSION,
    Calibration,
    CollectivePoint,
    ScalingPoint,
    busbw_at,
    device_tflops,
    from_dict,
    merge,
)


def _point(op: str, size: int, busbw: float) -> CollectivePoint:
    return CollectivePoint(op=op, bytes=size, seconds=1e-3, algbw_gbps=busbw, busbw_gbps=busbw)


FULL = Calibration(
    gpu="H100-SXM", network="nvswitch", host_cpus=64, collective_workers=8,
    collectives=(_point("all_reduce", 1024, 1.0), _point("all_gather", 2**20, 50.0)),
    achieved_tflops=400.0, threads_per_worker=8, precision="bf16-mixed",
    scaling=(ScalingPoint(1, 10.0, 0.5), ScalingPoint(8, 75.0)),
    scaling_script="train.py", notes=("first run",),
)

# -- file round trip ---------------------------------------------------------------------------


def test_to_dict_header() -> None:
    d = FULL.to_dict()
    assert d["kind"] == KIND == "gpufleet-calibration"
    assert d["version"] == VERSION == 1
    assert d["collectives"][1] == {"op": "all_gather", "bytes": 2**20, "seconds": 1e-3,
                                   "algbw_gbps": 50.0, "busbw_gbps": 50.0}
    assert d["notes"] == ["first run"]


def test_round_trip() -> None:
    assert from_dict(FULL.to_dict(), "cal.json") == FULL


def test_round_trip_through_json() -> None:
    assert from_dict(json.loads(json.dumps(FULL.to_dict())), "cal.json") == FULL


def test_round_trip_minimal() -> None:
    cal = Calibration(gpu="cpu", network="pcie")
    assert from_dict(cal.to_dict(), "cal.json") == cal


def _field_of(data: Any) -> tuple[str, str]:
    with pytest.raises(SpecError) as err:
        from_dict(data, "cal.json")
    [(field, msg)] = err.value.problems
    return field, msg


def test_rejects_wrong_kind() -> None:
    field, msg = _field_of({**FULL.to_dict(), "kind": "something-else"})
    assert field == "calibration"
    assert "cal.json" in msg
    assert "not a gpufleet calibration file" in msg


@pytest.mark.parametrize("data", [[1, 2], "text", None, {}])
def test_rejects_non_calibration(data: Any) -> None:
    assert _field_of(data)[0] == "calibration"


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_rejects_wrong_version(version: Any) -> None:
    field, msg = _field_of({**FULL.to_dict(), "version": version})
    assert field == "calibration"
    assert "version" in msg


@pytest.mark.parametrize(
    "change",
    [
        {"collectives": [{"op": "all_reduce", "seconds": 1.0, "algbw_gbps": 1.0, "busbw_gbps": 1.0}]},
        {"collectives": [{"op": "all_reduce", "bytes": "many", "seconds": 1.0, "algbw_gbps": 1.0,
                          "busbw_gbps": 1.0}]},
        {"collectives": ["not a dict"]},
        {"scaling": [{"samples_per_s": 1.0}]},
        {"achieved_tflops": "fast"},
        {"host_cpus": "four"},
    ],
)
def test_rejects_malformed_entries(change: dict[str, Any]) -> None:
    field, msg = _field_of({**FULL.to_dict(), **change})
    assert field == "calibration"
    assert "malformed entry" in msg


@pytest.mark.parametrize("key", ["gpu", "network"])
def test_rejects_missing_required_key(key: str) -> None:
    data = FULL.to_dict()
    del data[key]
    field, msg = _field_of(data)
    assert field == "calibration"
    assert "malformed entry" in msg
    assert key in msg


# -- merge -------------------------------------------------------------------------------------

COLLECTIVES = Calibration(gpu="H100-SXM", network="nvswitch", host_cpus=64, collective_workers=8,
                          collectives=(_point("all_reduce", 1024, 5.0),))
SCALING = Calibration(gpu="H100-SXM", network="nvswitch", achieved_tflops=400.0, threads_per_worker=4,
                      precision="bf16-mixed", scaling=(ScalingPoint(1, 10.0),), scaling_script="t.py")


def test_merge_without_old() -> None:
    assert merge(None, SCALING) == SCALING


def test_merge_scaling_keeps_collectives() -> None:
    got = merge(COLLECTIVES, SCALING)
    assert got.collectives == COLLECTIVES.collectives
    assert got.collective_workers == 8
    assert got.host_cpus == 64
    assert got.achieved_tflops == 400.0
    assert got.threads_per_worker == 4
    assert got.precision == "bf16-mixed"
    assert got.scaling == SCALING.scaling
    assert got.scaling_script == "t.py"


def test_merge_collectives_keeps_scaling() -> None:
    got = merge(SCALING, COLLECTIVES)
    assert got.collectives == COLLECTIVES.collectives
    assert got.achieved_tflops == 400.0
    assert got.scaling == SCALING.scaling
    assert got.scaling_script == "t.py"
    assert got.precision == "bf16-mixed"


def test_merge_new_measurement_replaces_same_part() -> None:
    newer = Calibration(gpu="H100-SXM", network="nvswitch", collective_workers=4,
                        collectives=(_point("all_gather", 2048, 9.0),))
    got = merge(COLLECTIVES, newer)
    assert got.collectives == newer.collectives
    assert got.collective_workers == 4


@pytest.mark.parametrize(("gpu", "network"), [("A100-80GB", "nvswitch"), ("H100-SXM", "pcie")])
def test_merge_other_cluster_replaces(gpu: str, network: str) -> None:
    new = Calibration(gpu=gpu, network=network, achieved_tflops=100.0)
    assert merge(COLLECTIVES, new) == new


# -- bus bandwidth lookup ------------------------------------------------------------------------

CURVE = Calibration(gpu="H100-SXM", network="nvswitch", collectives=(
    _point("all_reduce", 2**20, 20.0),  # given out of order: busbw_at sorts by size
    _point("all_reduce", 2**10, 10.0),
    _point("reduce_scatter", 2**10, 3.0),
    _point("reduce_scatter", 2**20, 7.0),
))


def test_busbw_exact_points() -> None:
    assert busbw_at(CURVE, "all_reduce", 2**10) == 10.0
    assert busbw_at(CURVE, "all_reduce", 2**20) == 20.0


def test_busbw_log_midpoint() -> None:
    # 2^15 is halfway between 2^10 and 2^20 in log(size): (10 + 20) / 2 = 15
    assert busbw_at(CURVE, "all_reduce", 2**15) == pytest.approx(15.0)
    # a quarter of the way: 2^12.5 -> 10 + 0.25 * 10 = 12.5
    assert busbw_at(CURVE, "all_reduce", 2**12.5) == pytest.approx(12.5)


def test_busbw_clamps_at_the_ends() -> None:
    assert busbw_at(CURVE, "all_reduce", 1) == 10.0
    assert busbw_at(CURVE, "all_reduce", 2**40) == 20.0


def test_busbw_all_gather_falls_back_to_reduce_scatter() -> None:
    assert busbw_at(CURVE, "all_gather", 2**15) == pytest.approx(5.0)


def test_busbw_reduce_scatter_falls_back_to_all_gather() -> None:
    cal = Calibration(gpu="x", network="pcie", collectives=(_point("all_gather", 4096, 8.0),))
    assert busbw_at(cal, "reduce_scatter", 4096) == 8.0


def test_busbw_own_op_preferred() -> None:
    cal = Calibration(gpu="x", network="pcie", collectives=(
        _point("all_gather", 4096, 8.0), _point("reduce_scatter", 4096, 2.0)))
    assert busbw_at(cal, "reduce_scatter", 4096) == 2.0
    assert busbw_at(cal, "all_gather", 4096) == 8.0


def test_busbw_missing_op() -> None:
    assert busbw_at(CURVE, "broadcast", 2**15) is None
    only_gather = Calibration(gpu="x", network="pcie", collectives=(_point("all_gather", 4096, 8.0),))
    assert busbw_at(only_gather, "all_reduce", 4096) is None  # no fallback for all-reduce
    assert busbw_at(Calibration(gpu="x", network="pcie"), "all_reduce", 4096) is None


def test_busbw_single_point() -> None:
    cal = Calibration(gpu="x", network="pcie", collectives=(_point("all_reduce", 4096, 8.0),))
    assert busbw_at(cal, "all_reduce", 1) == 8.0
    assert busbw_at(cal, "all_reduce", 2**30) == 8.0


def test_busbw_interpolation_is_in_log_space() -> None:
    # linear in size would give 10 + (2^15 - 2^10) / (2^20 - 2^10) * 10 = 10.3; log gives 15
    got = busbw_at(CURVE, "all_reduce", 2**15)
    assert got is not None
    assert not math.isclose(got, 10.0 + (2**15 - 2**10) / (2**20 - 2**10) * 10.0)


# -- compute rate --------------------------------------------------------------------------------


def test_device_tflops_cpu_scales_with_threads() -> None:
    # host_cpus=2, measured 1.0 TFLOPS with 2 threads; 2 workers get 2 // 2 = 1 thread -> 0.5
    cal = Calibration(gpu="cpu", network="pcie", host_cpus=2, threads_per_worker=2, achieved_tflops=1.0)
    assert device_tflops(cal, 2) == pytest.approx(0.5)
    assert device_tflops(cal, 1) == pytest.approx(1.0)
    # more workers than cores still get one thread each
    assert device_tflops(cal, 8) == pytest.approx(0.5)


def test_device_tflops_gpu_not_scaled() -> None:
    cal = Calibration(gpu="H100-SXM", network="nvswitch", host_cpus=2, threads_per_worker=2,
                      achieved_tflops=400.0)
    assert device_tflops(cal, 8) == 400.0
    assert device_tflops(cal, 1) == 400.0


def test_device_tflops_cpu_without_thread_info() -> None:
    cal = Calibration(gpu="cpu", network="pcie", achieved_tflops=1.0)
    assert device_tflops(cal, 4) == 1.0


def test_device_tflops_unmeasured() -> None:
    assert device_tflops(Calibration(gpu="cpu", network="pcie", host_cpus=2), 1) is None


def test_device_tflops_cpu_prefers_the_rate_measured_at_that_worker_count() -> None:
    # two threads on one worker ran at 1.0; two one-thread workers each at 0.7 (threads scale
    # sublinearly), so 2 workers use 0.7, not the thread-scaled 0.5; 4 workers fall back to it
    cal = Calibration(gpu="cpu", network="pcie", host_cpus=2, threads_per_worker=2, achieved_tflops=1.0,
                      scaling=(ScalingPoint(1, 100.0, None, 1.0), ScalingPoint(2, 140.0, None, 0.7)))
    assert device_tflops(cal, 2) == pytest.approx(0.7)
    assert device_tflops(cal, 1) == pytest.approx(1.0)
    assert device_tflops(cal, 4) == pytest.approx(0.5)


def test_device_tflops_gpu_ignores_per_count_rates() -> None:
    # a GPU's speed does not depend on the world size; rates measured with more workers
    # include their communication, which the planner adds itself
    cal = Calibration(gpu="H100-SXM", network="nvswitch", achieved_tflops=400.0,
                      scaling=(ScalingPoint(1, 10.0, None, 400.0), ScalingPoint(8, 70.0, None, 350.0)))
    assert device_tflops(cal, 8) == 400.0


def test_scaling_rates_survive_the_file() -> None:
    cal = Calibration(gpu="cpu", network="pcie", scaling=(ScalingPoint(2, 140.0, 0.01, 0.7),))
    assert from_dict(json.loads(json.dumps(cal.to_dict())), "f").scaling[0].tflops_per_device == 0.7


@pytest.mark.parametrize("patch, text", [
    ({"collectives": [{"op": "all_reduce", "bytes": 0, "seconds": 1e-3, "algbw_gbps": 1.0,
                       "busbw_gbps": 1.0}]}, "above zero"),
    ({"collectives": [{"op": "all_reduce", "bytes": 1024, "seconds": 1e-3, "algbw_gbps": 1.0,
                       "busbw_gbps": -5.0}]}, "above zero"),
    ({"collectives": [{"op": "all_to_all", "bytes": 1024, "seconds": 1e-3, "algbw_gbps": 1.0,
                       "busbw_gbps": 1.0}]}, "unknown collective"),
    ({"achieved_tflops": 0.0}, "achieved_tflops must be above zero"),
    ({"achieved_tflops": float("inf")}, "achieved_tflops must be above zero"),
    ({"scaling": [{"workers": 0, "samples_per_s": 10.0}]}, "worker counts and rates"),
])
def test_from_dict_refuses_impossible_measurements(patch: dict[str, Any], text: str) -> None:
    data = {**Calibration(gpu="cpu", network="pcie").to_dict(), **patch}
    with pytest.raises(SpecError) as err:
        from_dict(data, "c.json")
    [(field, msg)] = err.value.problems
    assert field == "calibration" and text in msg
