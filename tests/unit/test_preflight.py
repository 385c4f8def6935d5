"""Preflight: the model's shape read from a script's source, and every check a job passes before start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.catalog import GpuType, resolve_gpu
from gpufleet.errors import SpecError
from gpufleet.parallelism import Layout
from gpufleet.preflight import check, script_shape
from gpufleet.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]  # the checkout, wherever it is
GPT = "examples/gpt.py"

SOURCE = """
import argparse

def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-4)
    return p.parse_args()
"""


def gpt_source() -> str:
    return (ROOT / GPT).read_text(encoding="utf-8")


def job(**fields: Any) -> JobSpec:
    return JobSpec.parse({"script": GPT, "workdir": str(ROOT), **fields})


def problems_of(spec: JobSpec, gpu: GpuType, world: int, source: str | None) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        check(spec, gpu, world, source)
    return info.value.problems


def only_problem(spec: JobSpec, gpu: GpuType, world: int, source: str | None, field: str) -> str:
    """The message of the single problem, which must be on `field`."""
    problems = problems_of(spec, gpu, world, source)
    assert [f for f, _ in problems] == [field], problems
    return problems[0][1]


# ---------------------------------------------------------------- script_shape


def test_defaults_read_from_source() -> None:
    assert script_shape(SOURCE, []) == (6, 12)


def test_real_gpt_example_defaults() -> None:
    assert script_shape(gpt_source(), []) == (2, 4)


def test_args_override_defaults() -> None:
    assert script_shape(SOURCE, ["--layers", "3"]) == (3, 12)
    assert script_shape(SOURCE, ["--heads=8"]) == (6, 8)
    assert script_shape(SOURCE, ["--steps", "10", "--layers=4", "--heads", "2"]) == (4, 2)


def test_last_occurrence_of_a_flag_wins() -> None:
    assert script_shape(SOURCE, ["--layers", "3", "--layers", "5"]) == (5, 12)


def test_non_numeric_arg_falls_back_to_default() -> None:
    assert script_shape(SOURCE, ["--layers", "many"]) == (6, 12)
    assert script_shape(SOURCE, ["--layers"]) == (6, 12)


@pytest.mark.parametrize(
    ("layer_flag", "head_flag"),
    [
        ("--n_layer", "--n_head"),
        ("--n-layer", "--n-head"),
        ("--n_layers", "--n_heads"),
        ("--n-layers", "--n-heads"),
        ("--num_layers", "--num_heads"),
        ("--num-layers", "--num-heads"),
    ],
)
def test_alternative_flag_spellings(layer_flag: str, head_flag: str) -> None:
    source = (f"p.add_argument('{layer_flag}', type=int, default=24)\n"
              f"p.add_argument('{head_flag}', type=int, default=16)\n")
    assert script_shape(source, []) == (24, 16)
    assert script_shape(source, [layer_flag, "12", f"{head_flag}=8"]) == (12, 8)


def test_alias_flags_in_one_call() -> None:
    source = "parser.add_argument('-l', '--n_layer', type=int, default=9)"
    assert script_shape(source, []) == (9, None)


def test_args_without_source_are_still_read() -> None:
    assert script_shape(None, ["--n_layer", "7", "--num-heads=3"]) == (7, 3)


def test_bool_defaults_are_ignored() -> None:
    source = ("p.add_argument('--layers', action='store_true', default=False)\n"
              "p.add_argument('--heads', default=True)\n")
    assert script_shape(source, []) == (None, None)


def test_non_integer_defaults_are_ignored() -> None:
    source = ("p.add_argument('--layers', default='6')\n"
              "p.add_argument('--heads', type=float, default=4.0)\n")
    assert script_shape(source, []) == (None, None)


def test_unparsable_source_is_unknown() -> None:
    assert script_shape("def broken(:\n    p.add_argument('--layers', default=6)", []) == (None, None)


def test_unknown_shape_is_none() -> None:
    assert script_shape(None, []) == (None, None)
    assert script_shape("", []) == (None, None)
    assert script_shape("print('no argparse here')", ["--epochs", "3"]) == (None, None)
    assert script_shape("p.add_argument('--layers', type=int, default=6)", []) == (6, None)


def test_source_is_not_run() -> None:
    source = "raise SystemExit('ran')\np.add_argument('--heads', type=int, default=4)\n"
    assert script_shape(source, []) == (None, 4)


# ---------------------------------------------------------------- check: passes


def test_fine_fsdp_layout_returns_the_layout() -> None:
    layout = check(job(strategy="fsdp"), resolve_gpu("cpu"), 4, gpt_source())
    assert isinstance(layout, Layout)
    assert (layout.strategy, layout.dp, layout.tp, layout.pp) == ("fsdp", 4, 1, 1)


def test_fine_3d_layout_on_h100() -> None:
    spec = job(strategy="zero2", tp=2, pp=2, precision="bf16-mixed", args=["--heads", "8"])
    layout = check(spec, resolve_gpu("H100"), 8, gpt_source())
    assert (layout.dp, layout.tp, layout.pp, layout.precision) == (2, 2, 2, "bf16-mixed")


def test_unknown_script_shape_skips_model_checks() -> None:
    layout = check(job(strategy="pp", pp=8), resolve_gpu("cpu"), 8, None)
    assert layout.pp == 8


def test_fp16_on_v100_is_fine() -> None:
    assert check(job(precision="fp16-mixed"), resolve_gpu("V100"), 2, gpt_source()).dp == 2


# ---------------------------------------------------------------- check: model shape


def test_more_stages_than_the_gpt_layers_is_refused() -> None:
    msg = only_problem(job(strategy="pp", pp=4), resolve_gpu("cpu"), 4, gpt_source(), "pp")
    assert "4 pipeline stages" in msg and "2 layers" in msg


def test_script_args_deepen_the_model() -> None:
    spec = job(strategy="pp", pp=4, args=["--layers", "4"])
    assert check(spec, resolve_gpu("cpu"), 4, gpt_source()).pp == 4


def test_tp_not_dividing_gpt_heads_is_refused() -> None:
    msg = only_problem(job(strategy="tp"), resolve_gpu("cpu"), 3, gpt_source(), "tp")
    assert "degree 3" in msg and "4 attention heads" in msg
    assert "allowed: 1, 2, 4" in msg


def test_spec_model_overrides_the_script_shape() -> None:
    spec = job(strategy="pp", pp=4, model={"layers": 8})
    assert check(spec, resolve_gpu("cpu"), 4, gpt_source()).pp == 4
    spec = job(strategy="tp", model={"heads": 6})
    assert check(spec, resolve_gpu("cpu"), 3, gpt_source()).tp == 3
    spec = job(strategy="tp", model={"heads": 6})
    assert "6 attention heads" in only_problem(spec, resolve_gpu("cpu"), 4, gpt_source(), "tp")


def test_spec_model_part_left_out_keeps_the_script_value() -> None:
    # layers come from the model, heads (4) still from the script
    spec = job(tp=3, dp=1, model={"layers": 12})
    assert "4 attention heads" in only_problem(spec, resolve_gpu("cpu"), 3, gpt_source(), "tp")


def test_spec_model_overrides_script_args_too() -> None:
    spec = job(strategy="pp", pp=4, args=["--layers", "2"], model={"layers": 4})
    assert check(spec, resolve_gpu("cpu"), 4, gpt_source()).pp == 4


# ---------------------------------------------------------------- check: precision and framework


def test_bf16_on_v100_is_refused() -> None:
    msg = only_problem(job(precision="bf16-mixed"), resolve_gpu("V100"), 2, gpt_source(), "precision")
    assert "V100" in msg and "BF16" in msg and "fp16-mixed" in msg


def test_bf16_on_h100_and_cpu_is_fine() -> None:
    for gpu in ("H100", "cpu"):
        assert check(job(precision="bf16-mixed"), resolve_gpu(gpu), 2, gpt_source()).precision == \
            "bf16-mixed"


def test_deepspeed_with_tp_is_refused() -> None:
    spec = job(strategy="tp", framework="deepspeed")
    msg = only_problem(spec, resolve_gpu("H100"), 2, gpt_source(), "strategy")
    assert "deepspeed" in msg and "zero3" in msg and "no tp or pp" in msg


def test_deepspeed_with_a_tp_mesh_under_zero_is_refused() -> None:
    spec = job(strategy="zero2", tp=2, framework="deepspeed")
    assert "deepspeed" in only_problem(spec, resolve_gpu("H100"), 4, gpt_source(), "strategy")


def test_deepspeed_with_zero3_is_fine() -> None:
    layout = check(job(strategy="zero3", framework="deepspeed"), resolve_gpu("H100"), 4, gpt_source())
    assert (layout.framework, layout.dp) == ("deepspeed", 4)


def test_horovod_with_fsdp_is_refused() -> None:
    spec = job(strategy="fsdp", framework="horovod")
    msg = only_problem(spec, resolve_gpu("H100"), 2, gpt_source(), "strategy")
    assert "horovod" in msg and "ddp" in msg


def test_horovod_with_ddp_is_fine() -> None:
    assert check(job(framework="horovod"), resolve_gpu("H100"), 2, gpt_source()).framework == "horovod"


@pytest.mark.parametrize("framework", ["torchrun", "accelerate", "ray"])
def test_other_frameworks_run_any_strategy(framework: str) -> None:
    spec = job(strategy="tp", framework=framework)
    assert check(spec, resolve_gpu("H100"), 2, gpt_source()).tp == 2


def test_deepspeed_fp16_on_cpu_is_refused() -> None:
    spec = job(framework="deepspeed", precision="fp16-mixed")
    msg = only_problem(spec, resolve_gpu("cpu"), 2, gpt_source(), "precision")
    assert "DeepSpeed" in msg and "GPU" in msg


def test_fp16_on_cpu_without_deepspeed_is_fine() -> None:
    assert check(job(precision="fp16-mixed"), resolve_gpu("cpu"), 2, gpt_source()).precision == \
        "fp16-mixed"


def test_deepspeed_fp16_on_a_gpu_is_fine() -> None:
    spec = job(framework="deepspeed", precision="fp16-mixed")
    assert check(spec, resolve_gpu("V100"), 2, gpt_source()).framework == "deepspeed"


# ---------------------------------------------------------------- check: everything at once


def test_all_problems_are_reported_together() -> None:
    spec = job(strategy="pp", pp=4, framework="horovod", precision="bf16-mixed")
    problems = problems_of(spec, resolve_gpu("V100"), 4, gpt_source())
    fields = [f for f, _ in problems]
    assert sorted(fields) == ["pp", "precision", "strategy"]
    messages = dict(problems)
    assert "2 layers" in messages["pp"]
    assert "horovod" in messages["strategy"]
    assert "BF16" in messages["precision"]


def test_model_and_framework_problems_together() -> None:
    spec = job(tp=3, dp=1, framework="deepspeed", precision="fp16-mixed")
    problems = problems_of(spec, resolve_gpu("cpu"), 3, gpt_source())
    assert sorted(f for f, _ in problems) == ["precision", "strategy", "tp"]


def test_layout_problems_still_come_with_precision_problems() -> None:
    spec = job(dp=2, tp=2, precision="bf16-mixed")
    problems = problems_of(spec, resolve_gpu("V100"), 8, gpt_source())
    assert sorted(f for f, _ in problems) == ["mesh", "precision"]


def test_spec_error_message_names_each_field() -> None:
    spec = job(strategy="pp", pp=4, precision="bf16-mixed")
    with pytest.raises(SpecError) as info:
        check(spec, resolve_gpu("V100"), 4, gpt_source())
    text = str(info.value)
    assert "pp: " in text and "precision: " in text
    assert isinstance(info.value.problems, list)
    assert all(isinstance(p, tuple) and len(p) == 2 for p in info.value.problems)
