"""Layouts: resolving strategy and mesh on a worker count, the env round trip, model and GPU checks."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.parallelism import (
    SHARDED,
    Layout,
    LayoutError,
    model_problems,
    precision_problem,
    resolve,
)
from gpufleet.vocab import FRAMEWORKS, PRECISIONS, SCHEDULES, STRATEGIES


def problems_of(strategy: str, world: int, **kw: Any) -> list[tuple[str, str]]:
    with pytest.raises(LayoutError) as info:
        resolve(strategy, world, **kw)
    return info.value.problems


def fields_of(strategy: str, world: int, **kw: Any) -> set[str]:
    return {field for field, _ in problems_of(strategy, world, **kw)}


def only_problem(strategy: str, world: int, field: str, **kw: Any) -> str:
    """The message of the single problem on `field` (fails if there are none or several)."""
    msgs = [msg for f, msg in problems_of(strategy, world, **kw) if f == field]
    assert len(msgs) == 1, msgs
    return msgs[0]


# ---------------------------------------------------------------- resolve: each strategy fills its dim


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero1", "zero2", "zero3"])
def test_data_parallel_strategies_fill_dp(strategy: str) -> None:
    layout = resolve(strategy, 4)
    assert (layout.dp, layout.tp, layout.pp) == (4, 1, 1)
    assert layout.strategy == strategy
    assert layout.data_parallel == strategy
    assert layout.world_size == 4


def test_tp_strategy_fills_tp() -> None:
    layout = resolve("tp", 4)
    assert (layout.dp, layout.tp, layout.pp) == (1, 4, 1)
    assert layout.data_parallel == "ddp"


def test_pp_strategy_fills_pp() -> None:
    layout = resolve("pp", 4)
    assert (layout.dp, layout.tp, layout.pp) == (1, 1, 4)
    assert layout.data_parallel == "ddp"


def test_single_worker_is_all_ones() -> None:
    for strategy in STRATEGIES:
        layout = resolve(strategy, 1)
        assert (layout.dp, layout.tp, layout.pp) == (1, 1, 1)


def test_defaults_of_a_plain_layout() -> None:
    layout = resolve("ddp", 2)
    assert layout.precision == "fp32"
    assert layout.schedule == "1f1b"
    assert layout.framework == "torchrun"
    assert layout.microbatches == 1


def test_fill_dim_takes_what_the_fixed_dims_leave() -> None:
    assert (resolve("fsdp", 8, tp=2).dp, resolve("fsdp", 8, pp=2).dp) == (4, 4)
    layout = resolve("tp", 8, dp=2)
    assert (layout.dp, layout.tp, layout.pp) == (2, 4, 1)
    layout = resolve("pp", 8, tp=2)
    assert (layout.dp, layout.tp, layout.pp) == (1, 2, 4)


# ---------------------------------------------------------------- resolve: explicit meshes


def test_explicit_mesh_dp2_tp2_on_4() -> None:
    layout = resolve("ddp", 4, dp=2, tp=2)
    assert (layout.dp, layout.tp, layout.pp) == (2, 2, 1)
    assert layout.world_size == 4


def test_explicit_mesh_tp2_pp2_on_4() -> None:
    layout = resolve("fsdp", 4, dp=1, tp=2, pp=2)
    assert (layout.dp, layout.tp, layout.pp) == (1, 2, 2)
    assert layout.data_parallel == "fsdp"
    assert layout.microbatches == 2


def test_explicit_3d_mesh_on_8() -> None:
    layout = resolve("zero2", 8, dp=2, tp=2, pp=2)
    assert (layout.dp, layout.tp, layout.pp) == (2, 2, 2)
    assert layout.world_size == 8
    assert layout.data_parallel == "zero2"


def test_tp_and_pp_strategies_use_ddp_over_a_given_dp() -> None:
    layout = resolve("tp", 4, dp=2, tp=2)
    assert (layout.strategy, layout.data_parallel) == ("tp", "ddp")
    layout = resolve("pp", 8, dp=2, pp=4)
    assert (layout.strategy, layout.data_parallel) == ("pp", "ddp")


# ---------------------------------------------------------------- resolve: mesh problems


def test_product_mismatch_names_the_mesh_and_the_worker_count() -> None:
    msg = only_problem("ddp", 8, "mesh", dp=2, tp=2)
    assert "dp 2 x tp 2 x pp 1 = 4" in msg
    assert "8 workers" in msg


def test_product_too_large_is_refused() -> None:
    msg = only_problem("ddp", 4, "mesh", dp=2, tp=2, pp=2)
    assert "= 8" in msg and "4 workers" in msg


def test_world_size_not_divisible_names_the_fill_dim() -> None:
    problems = problems_of("ddp", 4, tp=3)
    assert [f for f, _ in problems] == ["dp"]
    msg = problems[0][1]
    assert "4 workers" in msg and "tp 3" in msg


def test_world_size_not_divisible_for_tp_strategy_names_tp() -> None:
    msg = only_problem("tp", 6, "tp", pp=4)
    assert "6 workers" in msg and "pp 4" in msg


@pytest.mark.parametrize("strategy", ["ddp", "tp", "pp"])
@pytest.mark.parametrize("dim", ["dp", "tp", "pp", "microbatches"])
def test_dims_below_one_are_refused(strategy: str, dim: str) -> None:
    msg = only_problem(strategy, 4, dim, **{dim: 0})
    assert "got 0" in msg and "at least 1" in msg


def test_zero1_with_tp_is_refused() -> None:
    msg = only_problem("zero1", 4, "strategy", tp=2)
    assert "zero1" in msg
    for alternative in ("ddp", "fsdp", "zero2", "zero3"):
        assert alternative in msg


def test_zero1_with_pp_is_refused() -> None:
    assert "zero1" in only_problem("zero1", 4, "strategy", pp=2)


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "fsdp", "ddp"])
def test_other_data_parallel_methods_combine_with_tp_and_pp(strategy: str) -> None:
    layout = resolve(strategy, 8, tp=2, pp=2)
    assert (layout.dp, layout.tp, layout.pp) == (2, 2, 2)


def test_tp_strategy_with_tp_1_on_several_workers_is_refused() -> None:
    problems = problems_of("tp", 4, tp=1, dp=4)
    assert [f for f, _ in problems] == ["tp"]
    assert "above 1" in problems[0][1]


def test_pp_strategy_with_pp_1_on_several_workers_is_refused() -> None:
    problems = problems_of("pp", 4, pp=1, dp=4)
    assert [f for f, _ in problems] == ["pp"]
    assert "at least 2" in problems[0][1]


def test_tp_strategy_with_tp_1_alone_reports_mesh_and_tp() -> None:
    assert fields_of("tp", 4, tp=1) == {"mesh", "tp"}


# ---------------------------------------------------------------- resolve: pipeline schedule


def test_microbatches_default_to_the_stage_count() -> None:
    assert resolve("pp", 4).microbatches == 4
    assert resolve("ddp", 8, pp=2).microbatches == 2


def test_explicit_microbatches_are_kept() -> None:
    assert resolve("pp", 4, microbatches=16).microbatches == 16


def test_1f1b_needs_as_many_microbatches_as_stages() -> None:
    msg = only_problem("pp", 4, "microbatches", microbatches=2)
    assert "1f1b" in msg
    assert "got 2 for 4 stages" in msg


def test_1f1b_with_exactly_one_microbatch_per_stage_is_fine() -> None:
    assert resolve("pp", 4, microbatches=4).microbatches == 4


def test_gpipe_allows_fewer_microbatches_than_stages() -> None:
    layout = resolve("pp", 4, schedule="gpipe", microbatches=2)
    assert (layout.schedule, layout.microbatches) == ("gpipe", 2)


def test_microbatches_without_pipeline_are_not_checked() -> None:
    assert resolve("ddp", 4, microbatches=1).microbatches == 1


# ---------------------------------------------------------------- resolve: unknown values


@pytest.mark.parametrize(
    ("strategy", "kw", "field", "bad", "allowed"),
    [
        ("megatron", {}, "strategy", "megatron", STRATEGIES),
        ("ddp", {"precision": "fp64"}, "precision", "fp64", PRECISIONS),
        ("ddp", {"schedule": "interleaved"}, "pp_schedule", "interleaved", SCHEDULES),
        ("ddp", {"framework": "slurm"}, "framework", "slurm", FRAMEWORKS),
    ],
)
def test_unknown_value_lists_the_allowed_ones(strategy: str, kw: dict[str, str], field: str, bad: str,
                                              allowed: tuple[str, ...]) -> None:
    msg = only_problem(strategy, 4, field, **kw)
    assert f"'{bad}' is not allowed" in msg
    assert msg.endswith("allowed: " + ", ".join(allowed))


def test_several_unknown_values_are_reported_together() -> None:
    problems = problems_of("megatron", 4, precision="fp64", schedule="zb", framework="slurm", dp=0)
    assert [f for f, _ in problems] == ["strategy", "precision", "pp_schedule", "framework", "dp"]


def test_several_mesh_problems_are_reported_together() -> None:
    # pp strategy with pp=1 on 8: the product is off and there is no pipeline
    assert fields_of("pp", 8, dp=2, tp=2, pp=1) == {"mesh", "pp"}
    # zero1 over a pipeline with too few microbatches
    assert fields_of("zero1", 4, pp=4, microbatches=2) == {"strategy", "microbatches"}


def test_layout_error_message_joins_every_problem() -> None:
    with pytest.raises(LayoutError) as info:
        resolve("megatron", 4, precision="fp64")
    text = str(info.value)
    assert text.startswith("strategy: ")
    assert "; precision: " in text
    assert isinstance(info.value, ValueError)


def test_non_dividing_world_still_reports_independent_problems() -> None:
    assert fields_of("zero1", 6, tp=4) == {"dp", "strategy"}


# ---------------------------------------------------------------- Layout: describe, env round trip


def test_world_size_is_the_mesh_product() -> None:
    assert Layout(strategy="ddp", data_parallel="ddp", dp=2, tp=3, pp=4).world_size == 24


def test_describe_mentions_mesh_schedule_and_precision() -> None:
    text = resolve("fsdp", 8, tp=2, pp=2, precision="bf16-mixed", schedule="gpipe").describe
    assert "dp=2 x tp=2 x pp=2" in text
    assert "data parallel by fsdp" in text
    assert "gpipe schedule, 2 microbatches" in text
    assert text.endswith("bf16-mixed")


@pytest.mark.parametrize(
    "layout",
    [
        resolve("ddp", 4),
        resolve("fsdp", 8, dp=2, tp=2, pp=2, precision="bf16-mixed", schedule="gpipe",
                microbatches=8, framework="accelerate"),
        resolve("pp", 4, microbatches=6, precision="fp16-mixed"),
        resolve("zero3", 2, framework="deepspeed"),
        resolve("tp", 1),
    ],
)
def test_env_round_trip(layout: Layout) -> None:
    env = layout.to_env()
    assert all(k.startswith("GPUFLEET_") and isinstance(v, str) for k, v in env.items())
    assert Layout.from_env(env, layout.world_size) == layout


def test_to_env_values() -> None:
    env = resolve("zero2", 8, tp=2, pp=2, microbatches=4).to_env()
    assert env["GPUFLEET_MESH"] == "dp=2,tp=2,pp=2"
    assert env["GPUFLEET_STRATEGY"] == "zero2"
    assert env["GPUFLEET_DATA_PARALLEL"] == "zero2"
    assert env["GPUFLEET_MICROBATCHES"] == "4"
    assert env["GPUFLEET_PP_SCHEDULE"] == "1f1b"


def test_from_env_ignores_unrelated_variables() -> None:
    layout = resolve("tp", 4)
    env = {**layout.to_env(), "PATH": "/usr/bin", "WORLD_SIZE": "4"}
    assert Layout.from_env(env, 4) == layout


def test_from_env_mesh_not_matching_world_size_is_refused() -> None:
    env = resolve("ddp", 4, dp=2, tp=2).to_env()
    with pytest.raises(ValueError) as info:
        Layout.from_env(env, 8)
    msg = str(info.value)
    assert "dp=2,tp=2,pp=1" in msg
    assert "4 ranks" in msg and "WORLD_SIZE is 8" in msg


@pytest.mark.parametrize("env", [None, {}, {"PATH": "/usr/bin"}])
def test_from_env_without_mesh_is_ddp_over_the_world(env: dict[str, str] | None) -> None:
    layout = Layout.from_env(env, 3)
    assert layout == resolve("ddp", 3)
    assert (layout.strategy, layout.data_parallel, layout.dp, layout.tp, layout.pp) == \
        ("ddp", "ddp", 3, 1, 1)


def test_from_env_without_mesh_keeps_the_precision() -> None:
    layout = Layout.from_env({"GPUFLEET_PRECISION": "bf16-mixed"}, 2)
    assert (layout.dp, layout.precision) == (2, "bf16-mixed")


def test_from_env_fills_missing_variables_with_defaults() -> None:
    layout = Layout.from_env({"GPUFLEET_MESH": "dp=1,tp=2,pp=2"}, 4)
    assert (layout.strategy, layout.data_parallel) == ("ddp", "ddp")
    assert (layout.dp, layout.tp, layout.pp) == (1, 2, 2)
    assert (layout.precision, layout.schedule, layout.microbatches, layout.framework) == \
        ("fp32", "1f1b", 1, "torchrun")


# ---------------------------------------------------------------- model_problems


def test_model_that_fits_has_no_problems() -> None:
    assert model_problems(resolve("ddp", 8, tp=2, pp=2), layers=4, heads=8) == []


def test_unknown_model_shape_is_not_checked() -> None:
    assert model_problems(resolve("pp", 8), layers=None, heads=None) == []
    assert model_problems(resolve("tp", 3), layers=None, heads=None) == []


def test_more_stages_than_layers_is_refused() -> None:
    problems = model_problems(resolve("pp", 4), layers=2, heads=None)
    assert [f for f, _ in problems] == ["pp"]
    msg = problems[0][1]
    assert "4 pipeline stages" in msg and "2 layers" in msg and "at most 2" in msg


def test_one_stage_per_layer_is_fine() -> None:
    assert model_problems(resolve("pp", 4), layers=4, heads=None) == []


def test_tp_not_dividing_heads_lists_the_divisors() -> None:
    problems = model_problems(resolve("tp", 4), layers=None, heads=6)
    assert [f for f, _ in problems] == ["tp"]
    msg = problems[0][1]
    assert "degree 4" in msg and "6 attention heads" in msg
    assert msg.endswith("allowed: 1, 2, 3, 6")


def test_tp_dividing_heads_is_fine() -> None:
    assert model_problems(resolve("tp", 4), layers=None, heads=12) == []


def test_both_model_problems_together() -> None:
    problems = model_problems(resolve("ddp", 8, tp=4, pp=2), layers=1, heads=6)
    assert [f for f, _ in problems] == ["pp", "tp"]


# ---------------------------------------------------------------- precision_problem


def test_bf16_refused_without_bf16_lists_fp16_when_available() -> None:
    msg = precision_problem("bf16-mixed", "V100", bf16=False, fp16=True)
    assert msg is not None
    assert "V100" in msg and "BF16" in msg
    assert msg.endswith("allowed precisions on it: fp32, fp16-mixed")


def test_bf16_refused_without_either_half_precision() -> None:
    msg = precision_problem("bf16-mixed", "OldCard", bf16=False, fp16=False)
    assert msg is not None
    assert msg.endswith("allowed precisions on it: fp32")


def test_fp16_refused_without_fp16() -> None:
    msg = precision_problem("fp16-mixed", "OldCard", bf16=True, fp16=False)
    assert msg is not None
    assert "OldCard" in msg and "FP16" in msg and msg.endswith("fp32")


@pytest.mark.parametrize(
    ("precision", "bf16", "fp16"),
    [
        ("fp32", False, False),
        ("bf16-mixed", True, False),
        ("bf16-mixed", True, True),
        ("fp16-mixed", False, True),
        ("fp16-mixed", True, True),
    ],
)
def test_supported_precisions_are_fine(precision: str, bf16: bool, fp16: bool) -> None:
    assert precision_problem(precision, "Card", bf16=bf16, fp16=fp16) is None


# ---------------------------------------------------------------- SHARDED


def test_sharded_covers_every_data_parallel_method() -> None:
    assert set(SHARDED) == {"ddp", "fsdp", "zero1", "zero2", "zero3"}


def test_sharded_zero_stages_grow() -> None:
    assert SHARDED["ddp"] == frozenset()
    assert SHARDED["zero1"] == {"optimizer"}
    assert SHARDED["zero2"] == {"optimizer", "gradients"}
    assert SHARDED["zero3"] == {"optimizer", "gradients", "parameters"}
    assert SHARDED["ddp"] < SHARDED["zero1"] < SHARDED["zero2"] < SHARDED["zero3"]


def test_fsdp_shards_like_zero3() -> None:
    assert SHARDED["fsdp"] == SHARDED["zero3"]
