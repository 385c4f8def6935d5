"""Input checks of `gpufleet plan` (gpufleet.spec_plan.PlanSpec): every problem is one SpecError of
(field, message) pairs."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet import catalog
from gpufleet.errors import SpecError
from gpufleet.spec_plan import PlanSpec


def _problems(data: dict[str, Any], model_optional: bool = False) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        PlanSpec.parse(data, model_optional=model_optional)
    return err.value.problems


def _fields(data: dict[str, Any], model_optional: bool = False) -> list[str]:
    return [f for f, _ in _problems(data, model_optional)]


def test_minimal_single_plan() -> None:
    spec = PlanSpec.parse({"model": "llama-3-8b", "gpu": "h100"})
    assert spec.model == "llama3-8b"  # aliases resolve to the catalog name
    assert spec.gpu == "H100-SXM"
    assert spec.precision == "bf16-mixed"
    assert spec.searching is False
    assert spec.deadline_h is None


def test_nones_are_dropped() -> None:
    spec = PlanSpec.parse({"model": "gpt2", "gpu": "H100", "count": None, "deadline": None})
    assert spec.count is None


def test_no_model() -> None:
    [(field, msg)] = _problems({"gpu": "H100"})
    assert field == "model"
    assert "--model" in msg and "--params" in msg and "--config" in msg


def test_nothing_given_reports_both() -> None:
    assert _fields({}) == ["model", "gpu"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [({"params": 7e9}, "--model and --params"), ({"config": "c.json"}, "--model and --config")],
)
def test_two_model_sources(extra: dict[str, Any], named: str) -> None:
    [(field, msg)] = _problems({"model": "gpt2", "gpu": "H100", **extra})
    assert field == "model"
    assert named in msg


def test_three_model_sources() -> None:
    [(field, msg)] = _problems({"model": "gpt2", "params": 7e9, "config": "c.json", "gpu": "H100"})
    assert field == "model"
    assert "--model and --params and --config" in msg


def test_params_or_config_alone_ok() -> None:
    assert PlanSpec.parse({"params": 7e9, "gpu": "H100"}).params == 7e9
    assert PlanSpec.parse({"config": "c.json", "gpu": "H100"}).config == "c.json"


def test_unknown_model_names_the_known_ones() -> None:
    [(field, msg)] = _problems({"model": "gpt5", "gpu": "H100"})
    assert field == "model"
    assert "unknown model 'gpt5'" in msg
    for name in catalog.models():
        assert name in msg


def test_unknown_gpu() -> None:
    [(field, msg)] = _problems({"model": "gpt2", "gpu": "Z80"})
    assert field == "gpu"
    assert "unknown GPU type 'Z80'" in msg
    assert "H100-SXM" in msg


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("precision", "int8", ["'fp32'", "'bf16-mixed'", "'fp16-mixed'"]),
        ("strategy", "dp", ["'ddp'", "'fsdp'", "'zero1'", "'zero2'", "'zero3'", "'tp'", "'pp'"]),
        ("network", "token-ring", ["'pcie'", "'nvlink'", "'nvswitch'", "'infiniband'", "'ethernet'"]),
        ("attention", "sparse", ["'flash'", "'eager'"]),
        ("pp_schedule", "zb", ["'gpipe'", "'1f1b'"]),
        ("framework", "jax", ["'torchrun'", "'deepspeed'"]),
    ],
)
def test_bad_literal_lists_allowed(field: str, value: str, allowed: list[str]) -> None:
    [(got_field, msg)] = _problems({"model": "gpt2", "gpu": "H100", field: value})
    assert got_field == field
    assert f"'{value}' is not allowed" in msg
    for a in allowed:
        assert a in msg


def test_bad_deadline() -> None:
    [(field, msg)] = _problems({"model": "gpt2", "samples": 1000, "deadline": "1x"})
    assert field == "deadline"
    assert "'1x' is not a duration" in msg


def test_zero_deadline() -> None:
    assert _fields({"model": "gpt2", "samples": 1000, "deadline": "0h"}) == ["deadline"]


@pytest.mark.parametrize(("text", "hours"), [("2d", 48.0), ("36h", 36.0), ("90m", 1.5), ("7200", 2.0)])
def test_deadline_hours(text: str, hours: float) -> None:
    spec = PlanSpec.parse({"model": "gpt2", "samples": 1000, "deadline": text})
    assert spec.deadline_h == pytest.approx(hours)
    assert spec.searching is True


def test_deadline_needs_samples() -> None:
    [(field, msg)] = _problems({"model": "gpt2", "deadline": "2d"})
    assert field == "samples"
    assert "--deadline" in msg


def test_budget_needs_samples() -> None:
    assert _fields({"model": "gpt2", "budget": 500}) == ["samples"]


def test_search_needs_no_gpu() -> None:
    spec = PlanSpec.parse({"model": "gpt2", "budget": 500, "samples": 10})
    assert spec.searching is True
    assert spec.gpu is None


def test_single_mode_needs_gpu() -> None:
    [(field, msg)] = _problems({"model": "gpt2"})
    assert field == "gpu"
    assert "--deadline" in msg  # points at the ranking as the alternative


def test_lora_rank_without_lora() -> None:
    [(field, msg)] = _problems({"model": "gpt2", "gpu": "H100", "lora_rank": 8})
    assert field == "lora_rank"
    assert "--lora" in msg


def test_lora_rank_with_lora() -> None:
    spec = PlanSpec.parse({"model": "gpt2", "gpu": "H100", "lora": True, "lora_rank": 8})
    assert spec.lora_rank == 8


def test_cross_field_problems_together() -> None:
    # two model sources, a deadline without samples and a LoRA rank without LoRA: all three at once
    fields = _fields({"model": "gpt2", "params": 1e9, "deadline": "1d", "lora_rank": 4})
    assert fields == ["model", "samples", "lora_rank"]


@pytest.mark.parametrize(("field", "value"), [("count", 0), ("count", 129), ("micro_batch", 0), ("top", 0)])
def test_ranges(field: str, value: int) -> None:
    [(got, msg)] = _problems({"model": "gpt2", "gpu": "H100", field: value})
    assert got == field
    assert f"got {value}" in msg


def test_unknown_field() -> None:
    assert _problems({"model": "gpt2", "gpu": "H100", "bogus": 1}) == [("bogus", "unknown field")]


def test_model_optional_drops_missing_model_only() -> None:
    spec = PlanSpec.parse({"gpu": "H100"}, model_optional=True)
    assert spec.model is None and spec.params is None and spec.config is None
    # the other problems stay
    assert _fields({}, model_optional=True) == ["gpu"]
    # two sources is still a problem
    assert _fields({"model": "gpt2", "params": 1e9, "gpu": "H100"}, model_optional=True) == ["model"]


ONE = {"model": "llama3-8b", "gpu": "H100", "count": 8}
RANK = {"model": "llama3-8b", "samples": 1000, "deadline": "24h"}


@pytest.mark.parametrize("extra, field", [
    ({"tp": 2}, "tp"), ({"pp": 2}, "pp"), ({"dp": 4}, "dp"), ({"microbatches": 8}, "microbatches"),
    ({"pp_schedule": "gpipe"}, "pp_schedule"),
])
def test_a_ranking_refuses_a_fixed_mesh(extra: dict[str, Any], field: str) -> None:
    [(f, msg)] = _problems({**RANK, **extra})
    assert f == field and "a ranking chooses the mesh itself" in msg


@pytest.mark.parametrize("extra, field", [
    ({"top": 5}, "top"),
    ({"microbatches": 4}, "microbatches"),
    ({"sequence_parallel": True}, "sequence_parallel"),
    ({"strategy": "pp", "grad_accum": 2}, "grad_accum"),
    ({"pp": 2, "grad_accum": 2}, "grad_accum"),
])
def test_one_cluster_refuses_options_it_would_ignore(extra: dict[str, Any], field: str) -> None:
    assert field in _fields({**ONE, **extra})


def test_options_that_apply_are_accepted() -> None:
    PlanSpec.parse({**ONE, "pp": 2, "microbatches": 8})
    PlanSpec.parse({**ONE, "tp": 2, "sequence_parallel": True})
    PlanSpec.parse({**ONE, "grad_accum": 4})
    assert PlanSpec.parse({**RANK, "top": 3}).top == 3


@pytest.mark.parametrize("params", [float("inf"), float("nan"), 1e16])
def test_params_must_be_a_finite_size(params: float) -> None:
    assert _fields({"params": params, "gpu": "H100"}) == ["params"]
