"""`gpufleet bench allreduce` and `bench scaling` on a real 2-slot CPU cluster, and the planner
calibrated by them.

What a test can check without asserting a speed: the sweep's rows obey the bandwidth formulas,
the two benches write one calibration file, a CPU plan is refused without it and made with its
rates (labelled calibrated), and a larger micro-batch is predicted faster but less than twice as
fast (the same all-reduce each step). How close a calibrated prediction
comes to a measured run is a speed on a shared machine, so it is a benchmark figure, not a test:
bench/planner.py, in BENCHMARKS.md.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fleet_helpers import EXAMPLES, Fleet, error_lines

GPT = str(EXAMPLES / "gpt.py")
CONFIG = str(EXAMPLES / "gpt-config.json")


def scaling(fleet: Fleet, batch: int, steps: int) -> dict[str, Any]:
    r = fleet.ok("bench", "scaling", "--cluster", "cal", "--script", GPT, "--workers", "1,2",
                 "--config", CONFIG, "--json", "--",
                 "--config", CONFIG, "--steps", str(steps), "--batch-size", str(batch),
                 "--checkpoint-every", "0", "--log-every", "10", timeout=300)
    return json.loads(r.stdout)


def test_benches_calibrate_the_planner(fleet: Fleet) -> None:
    fleet.ok("launch", "--gpu", "cpu", "--count", "2", "--name", "cal", "-y")
    # without --out: under the state folder, not the current one (it may be a checkout)
    cal = fleet.home / "calibrations" / "calibration-cal.json"

    sweep = fleet.json("bench", "allreduce", "--cluster", "cal", "--sizes", "4K:4M", "--iters", "5",
                       "--json")
    assert sweep["calibration"] == str(cal)
    ops = {row["op"] for row in sweep["rows"]}
    assert ops == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert len(sweep["rows"]) == 4 * 6  # 4K, 16K, 64K, 256K, 1M, 4M: powers of 4
    for row in sweep["rows"]:
        assert row["time_us"] > 0
        # nccl-tests' factors for 2 ranks: all-reduce 2(n-1)/n = 1, gather/scatter (n-1)/n = 1/2
        factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}[row["op"]]
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)

    calibrated = scaling(fleet, batch=16, steps=30)
    assert calibrated["calibration"] == str(cal)
    assert [row["workers"] for row in calibrated["rows"]] == [1, 2]
    assert calibrated["achieved_tflops"] > 0
    saved = json.loads(cal.read_text())
    assert saved["collectives"] and saved["scaling"], "the two benches share one file"
    assert saved["threads_per_worker"] == 2 // 1  # one worker alone gets both cores

    ask = ("plan", "--config", CONFIG, "--gpu", "cpu", "--count", "2", "--precision", "fp32",
           "--json")
    refused = fleet(*ask, "--micro-batch", "32")  # CPU workers have no catalog peak
    assert refused.returncode == 2 and "calibration:" in refused.stderr, refused.stderr
    # by its name, from any folder: the planner looks where the benches write
    small = fleet.json(*ask, "--micro-batch", "16", "--calibration", cal.name)
    large = fleet.json(*ask, "--micro-batch", "32", "--calibration", str(cal))
    assert "compute" in large["rates"]["calibrated"]
    assert "compute" in small["rates"]["calibrated"]
    # the same all-reduce per step over twice the compute: more samples per second, not double
    assert small["samples_per_s"] < large["samples_per_s"] < 2 * small["samples_per_s"]
    assert list(fleet.cwd.iterdir()) == [], "the benches left files in the current folder"


def test_bench_refuses_bad_requests_in_one_line(fleet: Fleet) -> None:
    fleet.ok("launch", "--gpu", "cpu", "--count", "1", "--name", "one", "-y")
    cases = [
        (("bench", "allreduce", "--cluster", "nope"), "nope"),
        (("bench", "allreduce", "--cluster", "one"), "cluster: 'one' has 1 device"),
        (("bench", "allreduce", "--cluster", "one", "--sizes", "lots"), "sizes:"),
        (("bench", "scaling", "--cluster", "one", "--script", GPT, "--workers", "1,2"),
         "workers: 2 exceed the 1 devices"),
        (("bench", "scaling", "--cluster", "one", "--script", GPT, "--workers", "x"), "workers:"),
        (("bench", "scaling", "--cluster", "one", "--script", GPT, "--workers", "2", "--config", CONFIG),
         "workers: include 1"),
        (("bench", "allreduce", "--cluster", "one", "--out", "/"), "out: / is a folder"),
        (("bench", "scaling", "--cluster", "one", "--script", "missing.py", "--workers", "1"),
         "script: missing.py: no such file"),
    ]
    for args, text in cases:
        r = fleet(*args)
        lines = error_lines(r.stderr)
        assert r.returncode == 2 and len(lines) == 1 and text in lines[0], (args, r.stdout, r.stderr)
