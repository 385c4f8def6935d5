"""Checks a job must pass before any process starts: its layout, its model, its GPU, its framework.

A mesh that does not multiply out to the worker count, more pipeline stages than layers, a
tensor-parallel degree that splits an attention head, or bf16 on a GPU without it would all fail
minutes later inside every worker, after the cluster is paid for. Here they fail at once, all
together, each naming its field.
"""

from __future__ import annotations

import ast

from gpufleet.catalog import GpuType
from gpufleet.errors import SpecError
from gpufleet.parallelism import Layout, LayoutError, model_problems, precision_problem
from gpufleet.spec import JobSpec

# The argparse flags scripts commonly use for their model's depth and width in heads.
LAYER_FLAGS = ("--layers", "--n-layers", "--n_layers", "--num-layers", "--num_layers", "--n-layer",
               "--n_layer")
HEAD_FLAGS = ("--heads", "--n-heads", "--n_heads", "--num-heads", "--num_heads", "--n-head",
              "--n_head")

# What each framework can run: DeepSpeed brings its own ZeRO, Horovod only replicates.
FRAMEWORK_STRATEGIES = {
    "torchrun": None,  # all
    "accelerate": None,
    "ray": None,
    "deepspeed": ("ddp", "zero1", "zero2", "zero3", "fsdp"),
    "horovod": ("ddp",),
}


def _argparse_defaults(source: str) -> dict[str, int]:
    """Integer defaults of `add_argument("--flag", ..., default=N)` calls, found without running
    the script (importing it could start training or need a GPU)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        for kw in node.keywords:
            if kw.arg == "default" and isinstance(kw.value, ast.Constant) \
                    and isinstance(kw.value.value, int) and not isinstance(kw.value.value, bool):
                for flag in flags:
                    found[flag] = kw.value.value
    return found


def _from_args(args: list[str], flags: tuple[str, ...]) -> int | None:
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in flags:
            text = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            if text.isdigit():
                value = int(text)
    return value


def script_shape(source: str | None, args: list[str]) -> tuple[int | None, int | None]:
    """(layers, heads) from the script's arguments, else its argparse defaults; None if unknown."""
    defaults = _argparse_defaults(source) if source else {}
    out: list[int | None] = []
    for flags in (LAYER_FLAGS, HEAD_FLAGS):
        given = _from_args(args, flags)
        if given is None:
            given = next((defaults[f] for f in flags if f in defaults), None)
        out.append(given)
    return out[0], out[1]


# The module each framework's launcher needs in the job's Python, and how to get it.
FRAMEWORK_MODULES = {
    "accelerate": ("accelerate", "pip install 'gpufleet[accelerate]'"),
    "deepspeed": ("deepspeed", "pip install 'gpufleet[deepspeed]'"),
    "ray": ("ray.train", "pip install 'gpufleet[ray]'"),
    "horovod": ("horovod.torch", "HOROVOD_WITH_PYTORCH=1 pip install horovod (a source build; "
                "needs cmake and a compiler)"),
}


def missing_framework(framework: str, importable: set[str]) -> str | None:
    """The problem when the framework's module is not importable, else None."""
    need = FRAMEWORK_MODULES.get(framework)
    if need is None or need[0] in importable:
        return None
    return (f"{framework} is not installed in this Python ({need[0]} does not import); "
            f"install it with: {need[1]}; --dry-run shows the commands without it")


def check(spec: JobSpec, gpu: GpuType, world_size: int, script_source: str | None) -> Layout:
    """The job's layout on `world_size` workers of `gpu`; a SpecError listing every problem."""
    problems: list[tuple[str, str]] = []
    layout: Layout | None = None
    try:
        layout = spec.layout(world_size)
    except LayoutError as exc:
        problems.extend(exc.problems)
    if layout is not None:
        layers, heads = script_shape(script_source, spec.args)
        if spec.model is not None:
            layers = spec.model.layers or layers
            heads = spec.model.heads or heads
        problems.extend(model_problems(layout, layers, heads))
    allowed = FRAMEWORK_STRATEGIES[spec.framework]
    meshed = (spec.tp or 1) > 1 or (spec.pp or 1) > 1 or (layout is not None and layout.tp * layout.pp > 1)
    if allowed is not None and (spec.strategy not in allowed or meshed):
        problems.append(("strategy", f"framework {spec.framework} runs only: "
                         f"{', '.join(allowed)} (no tp or pp mesh); got {spec.strategy}"
                         + (" with a tp/pp mesh" if meshed else "")))
    if spec.framework == "deepspeed" and spec.precision == "fp16-mixed" and gpu.is_cpu:
        problems.append(("precision", "DeepSpeed's fp16 needs a GPU; on cpu use: fp32, bf16-mixed"))
    bad_precision = precision_problem(spec.precision, gpu.name, gpu.bf16,
                                      gpu.fp16_tflops > 0 or gpu.is_cpu)
    if bad_precision:
        problems.append(("precision", bad_precision))
    if problems:
        raise SpecError(problems)
    assert layout is not None
    return layout
