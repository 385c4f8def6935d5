"""Each list of allowed values is defined once (gpufleet.vocab) and every reader uses that list:
the spec models pydantic checks, the layout rules, preflight's per-framework table and the
CLI's help."""

from __future__ import annotations

import typing

import pytest

from gpufleet import vocab
from gpufleet.plan.recommend import DP_STRATEGIES
from gpufleet.preflight import FRAMEWORK_STRATEGIES
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.spec_plan import PlanSpec


def _choices(model: type[typing.Any], field: str) -> tuple[str, ...]:
    """The values a model's Literal field allows (`X | None` unwrapped)."""
    annotation = model.model_fields[field].annotation
    args = typing.get_args(annotation)
    if type(None) in args:
        (annotation,) = (a for a in args if a is not type(None))
    return typing.get_args(annotation)


@pytest.mark.parametrize(("model", "field", "words"), [
    (JobSpec, "strategy", vocab.STRATEGIES),
    (JobSpec, "precision", vocab.PRECISIONS),
    (JobSpec, "pp_schedule", vocab.SCHEDULES),
    (JobSpec, "framework", vocab.FRAMEWORKS),
    (ClusterSpec, "network", vocab.NETWORKS),
    (PlanSpec, "strategy", vocab.STRATEGIES),
    (PlanSpec, "precision", vocab.PRECISIONS),
    (PlanSpec, "pp_schedule", vocab.SCHEDULES),
    (PlanSpec, "framework", vocab.FRAMEWORKS),
    (PlanSpec, "network", vocab.NETWORKS),
])
def test_the_spec_models_allow_exactly_the_vocabulary(model: type[typing.Any], field: str,
                                                       words: tuple[str, ...]) -> None:
    assert _choices(model, field) == words


def test_the_subsets_are_drawn_from_their_lists() -> None:
    assert set(vocab.DATA_PARALLEL) < set(vocab.STRATEGIES)
    assert set(vocab.ACCELERATE_STRATEGIES) < set(vocab.DATA_PARALLEL)
    assert set(DP_STRATEGIES) <= set(vocab.DATA_PARALLEL)  # what the planner tries
    assert set(vocab.IN_NODE_NETWORKS) | set(vocab.INTER_NODE_NETWORKS) == set(vocab.NETWORKS)
    assert not set(vocab.IN_NODE_NETWORKS) & set(vocab.INTER_NODE_NETWORKS)
    assert set(vocab.NVLINK_NETWORKS) < set(vocab.IN_NODE_NETWORKS)
    assert set(FRAMEWORK_STRATEGIES) == set(vocab.FRAMEWORKS)
    for allowed in FRAMEWORK_STRATEGIES.values():
        assert allowed is None or set(allowed) <= set(vocab.STRATEGIES)


def test_a_refusal_lists_every_allowed_value_in_order() -> None:
    from gpufleet.errors import SpecError

    with pytest.raises(SpecError) as err:
        PlanSpec.parse({"model": "gpt2-small", "gpu": "H100", "strategy": "zero9"})
    assert "'zero9' is not allowed; allowed: " + ", ".join(
        f"'{s}'" for s in vocab.STRATEGIES[:-1]) + f" or '{vocab.STRATEGIES[-1]}'" in str(err.value)


def test_the_help_names_the_choices() -> None:
    from gpufleet.cli import options

    helps = {name: typing.get_args(getattr(options, name))[1].help
             for name in ("Strategy", "PpSchedule", "Framework", "RunPrecision", "Network")}
    assert helps["Strategy"].startswith("ddp, fsdp, zero1, zero2, zero3, tp or pp.")
    assert helps["PpSchedule"].startswith("gpipe or 1f1b.")
    assert helps["Framework"].startswith("torchrun, accelerate, deepspeed, ray or horovod.")
    assert helps["RunPrecision"].startswith("fp32, bf16-mixed or fp16-mixed.")
    assert helps["Network"].startswith("pcie, nvlink, nvswitch, infiniband or ethernet.")
    assert vocab.spoken(("one",)) == "one"
