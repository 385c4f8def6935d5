"""The strategy runs several test modules share: `workers/strategies.py` under torchrun.

One 2-rank and one 4-rank launch train every layout the tests look at (each launch pays the
imports of torch on every rank once: most of its cost on a small machine); test_strategies.py
checks losses and shards, test_plan_measured.py the planner's memory against the same runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKERS = Path(__file__).parent / "workers"


def torchrun(nproc: int, script: str, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("GPUFLEET_REPORT_ADDR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(nproc), str(WORKERS / script), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=WORKERS,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def results(nproc: int, configs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = torchrun(nproc, "strategies.py", json.dumps(configs))
    rows = [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(rows) == len(configs), out
    return {json.dumps(r["config"], sort_keys=True): r for r in rows}


def key(cfg: dict[str, Any]) -> str:
    return json.dumps(cfg, sort_keys=True)


def assert_losses(r: dict[str, Any]) -> None:
    losses, fp32 = r["losses"], r["fp32"]
    precision = r["config"].get("precision", "fp32")
    if precision == "fp32":
        assert losses == pytest.approx(fp32, rel=1e-4), r["layout"]
    else:
        assert losses == pytest.approx(fp32, abs=0.01), r["layout"]
    if precision == "fp16-mixed":
        assert losses == pytest.approx(r["same_precision"], abs=1e-3), r["layout"]
    assert losses[-1] != losses[0], "training did not move"


TWO = [
    {"strategy": "ddp"}, {"strategy": "fsdp"}, {"strategy": "zero1"}, {"strategy": "zero2"},
    {"strategy": "zero3"}, {"strategy": "tp"}, {"strategy": "pp"},
    {"strategy": "pp", "schedule": "gpipe", "microbatches": 4},
    {"strategy": "ddp", "precision": "bf16-mixed"}, {"strategy": "fsdp", "precision": "bf16-mixed"},
    {"strategy": "tp", "precision": "bf16-mixed"},
    {"strategy": "ddp", "precision": "fp16-mixed"}, {"strategy": "fsdp", "precision": "fp16-mixed"},
    {"strategy": "tp", "precision": "fp16-mixed"}, {"strategy": "pp", "precision": "fp16-mixed"},
]
FOUR = [
    {"strategy": "zero3"}, {"strategy": "fsdp", "dp": 2, "tp": 2}, {"strategy": "ddp", "dp": 2, "tp": 2},
    {"strategy": "ddp", "dp": 1, "tp": 2, "pp": 2}, {"strategy": "ddp", "dp": 2, "pp": 2},
    {"strategy": "fsdp", "dp": 2, "pp": 2}, {"strategy": "pp", "schedule": "gpipe"}, {"strategy": "tp"},
]
DEEPSPEED = [{"strategy": s, "framework": "deepspeed"} for s in ("ddp", "zero1", "zero2", "zero3")] + [
    {"strategy": "zero2", "framework": "deepspeed", "precision": "bf16-mixed"}]
# a script that calls deepspeed.initialize itself with the generated ds_config.json
OWN_DEEPSPEED = {"strategy": "zero1", "framework": "deepspeed", "script_args": ["--batch-size", "4"]}
# the planner's memory is checked for these on four ranks too (test_plan_measured.py)
FOUR_PLANNED = [{"strategy": "ddp"}, {"strategy": "fsdp"}, {"strategy": "zero1"}]
