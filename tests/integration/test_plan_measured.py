"""The planner's model-state memory against what each rank really holds.

`workers/strategies.py` trains the tiny GPT (4 layers, dim 32, 4 heads, vocab 256, seq 16) under
several layouts on real gloo process groups and reports every rank's bytes of parameters,
gradients and Adam state (`train.model_state_bytes`, after the first optimizer step). The planner
sees only the model's shape, from the same GPT-2 formula `plan --config` uses.

Exact for the methods that split every tensor evenly (DDP, FSDP, ZeRO-3: each tensor's first
dimension divides by the world size here). ZeRO-1 (torch's ZeroRedundancyOptimizer) gives whole
parameters' state to ranks, so only the sum over ranks is exact. gpufleet's zero2 keeps the fp32
weights sharded between steps and gathers them for forward and backward; the planner counts the
gathered copy, the peak.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from strategy_runs import FOUR_PLANNED, key

from gpufleet.parallelism import resolve
from gpufleet.plan import memory
from gpufleet.plan.models import param_count

# The worker's model (tests/integration/workers/strategies.py): GPT-2 style, untied head.
PARAMS = param_count("gpt2", layers=4, hidden=32, heads=4, kv_heads=4, ffn=128, vocab=256,
                     max_seq=16, tied=False)

TWO = [{"strategy": s} for s in ("ddp", "fsdp", "zero1", "zero2", "zero3")] + [
    {"strategy": "fsdp", "precision": "bf16-mixed"}, {"strategy": "ddp", "precision": "bf16-mixed"}]
FOUR = [*FOUR_PLANNED, {"strategy": "zero3"}]


def planned(cfg: dict[str, Any], world: int) -> memory.StateBytes:
    layout = resolve(cfg["strategy"], world, precision=cfg.get("precision", "fp32"))
    return memory.model_state(PARAMS, PARAMS, data_parallel=layout.data_parallel, dp=layout.dp,
                              tp=layout.tp, pp=layout.pp, precision=layout.precision,
                              framework=layout.framework)


@pytest.fixture
def measured(two_ranks: dict[str, dict[str, Any]],
             four_ranks: dict[str, dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    """The runs test_strategies.py checks (conftest.py): every layout here is one of theirs."""
    runs = {2: {k: r for k, r in two_ranks.items() if json.loads(k) in TWO},
            4: {k: r for k, r in four_ranks.items() if json.loads(k) in FOUR}}
    assert sorted(runs[2]) == sorted(map(key, TWO)) and sorted(runs[4]) == sorted(map(key, FOUR)), \
        "a layout checked here is missing from strategy_runs.py's launches"
    return runs


def test_the_shape_formula_counts_the_workers_model(measured: dict[int, dict[str, dict[str, Any]]]) -> None:
    for row in measured[2].values():
        assert row["params_total"] == PARAMS * 4  # fp32 bytes of the whole model


@pytest.mark.parametrize("world, cfg", [(2, c) for c in TWO if c["strategy"] in ("ddp", "fsdp", "zero3")]
                         + [(4, c) for c in FOUR if c["strategy"] in ("ddp", "fsdp", "zero3")])
def test_even_splits_match_every_rank_exactly(measured: dict[int, dict[str, dict[str, Any]]],
                                              world: int, cfg: dict[str, Any]) -> None:
    plan = planned(cfg, world)
    for state in measured[world][key(cfg)]["states"]:
        assert state["params_bytes"] == plan.weights
        assert state["grads_bytes"] == plan.gradients
        assert state["optimizer_bytes"] == plan.optimizer


@pytest.mark.parametrize("world", [2, 4])
def test_zero1_splits_the_optimizer_state_in_total(measured: dict[int, dict[str, dict[str, Any]]],
                                                   world: int) -> None:
    cfg = {"strategy": "zero1"}
    plan = planned(cfg, world)
    states = measured[world][key(cfg)]["states"]
    for state in states:  # weights and gradients are whole on every rank
        assert state["params_bytes"] == plan.weights == PARAMS * 4
        assert state["grads_bytes"] == plan.gradients == PARAMS * 4
    # whole parameters go to ranks, so ranks differ; the world holds exactly one copy
    assert sum(s["optimizer_bytes"] for s in states) == plan.optimizer * world == PARAMS * 8
    assert max(s["optimizer_bytes"] for s in states) < PARAMS * 8  # and it is split


def test_zero2_shards_gradients_and_optimizer(measured: dict[int, dict[str, dict[str, Any]]]) -> None:
    cfg = {"strategy": "zero2"}
    plan = planned(cfg, 2)
    for state in measured[2][key(cfg)]["states"]:
        assert state["grads_bytes"] == plan.gradients == PARAMS * 4 / 2
        assert state["optimizer_bytes"] == plan.optimizer == PARAMS * 8 / 2
        # at rest gpufleet keeps a shard; the planner counts the gathered weights (the peak)
        assert state["params_bytes"] == plan.weights / 2
