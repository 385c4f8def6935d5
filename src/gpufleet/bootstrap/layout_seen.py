"""What a script built for itself, seen from the inside at its first optimizer step.

gpufleet records the layout it applied only when the script called `prepare`; otherwise the job
records what the script did on its own: DDP (seen when a DistributedDataParallel is built), FSDP1
(its flat parameters), FSDP2 (`fully_shard` called) or tensor parallel (`parallelize_module`
called), both, other DTensor parameters, DeepSpeed (an engine built by `deepspeed.initialize`),
or none of these (each rank trains alone, or the script does
something gpufleet cannot see).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from gpufleet.bootstrap import importwatch

_BUILT: set[str] = set()  # wrappers the script constructed: "ddp", "deepspeed"


def _wrap_init(cls: Any, label: str) -> None:
    import functools

    inner = cls.__init__

    @functools.wraps(inner)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _BUILT.add(label)
        inner(self, *args, **kwargs)

    cls.__init__ = __init__


def _on_ddp(module: ModuleType) -> None:
    _wrap_init(module.DistributedDataParallel, "ddp")


def _on_fsdp1(module: ModuleType) -> None:
    # with use_orig_params=True its parameters are not flat: the constructor is the evidence
    _wrap_init(module.FullyShardedDataParallel, "fsdp")


def _wrap_call(module: ModuleType, name: str, label: str) -> None:
    """Note that the script called `module.name`; the function is otherwise untouched (its
    attributes, such as `fully_shard.state`, are copied onto the wrapper). Modules that
    re-export it already (imported before the bootstrap was armed: a warm rank's forkserver
    imported them) get the wrapper too, or `from torch.distributed.fsdp import fully_shard`
    would call around it."""
    import functools

    inner = getattr(module, name, None)
    if inner is None:
        return

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _BUILT.add(label)
        return inner(*args, **kwargs)

    importwatch.rebind(name, inner, wrapper)


def _on_fully_shard(module: ModuleType) -> None:
    # the defining module, before torch.distributed.fsdp re-exports the name
    _wrap_call(module, "fully_shard", "fsdp2")


def _on_tensor_parallel(module: ModuleType) -> None:
    _wrap_call(module, "parallelize_module", "tp")


def _on_deepspeed(module: ModuleType) -> None:
    inner = getattr(module, "initialize", None)
    if inner is None:
        return

    def initialize(*args: Any, **kwargs: Any) -> Any:
        _BUILT.add("deepspeed")
        return inner(*args, **kwargs)

    module.initialize = initialize  # type: ignore[attr-defined]


def watch() -> None:
    importwatch.when_imported("torch.nn.parallel.distributed", _on_ddp)
    importwatch.when_imported("deepspeed", _on_deepspeed)
    importwatch.when_imported("torch.distributed.fsdp.fully_sharded_data_parallel", _on_fsdp1)
    importwatch.when_imported("torch.distributed.fsdp._fully_shard._fully_shard", _on_fully_shard)
    importwatch.when_imported("torch.distributed.tensor.parallel.api", _on_tensor_parallel)


def _param_kinds(optimizer: Any) -> set[str]:
    kinds: set[str] = set()
    for group in getattr(optimizer, "param_groups", []):
        for p in group.get("params", []):
            name = type(p).__name__
            if name == "DTensor":
                kinds.add("dtensor")
            elif name == "FlatParameter" or getattr(p, "_is_flat_param", False):
                kinds.add("fsdp")
    return kinds


def own_layout(optimizer: Any, built: set[str], distributed: bool) -> str:
    """The script's own layout, most specific first: FSDP2/DTensor, FSDP1, DeepSpeed, DDP, or
    'none' (no wrapper gpufleet knows) and 'single' (no process group at all)."""
    kinds = _param_kinds(optimizer)
    if "dtensor" in kinds:
        if {"fsdp2", "tp"} <= built:
            return "fsdp2+tp"
        for label in ("fsdp2", "tp"):
            if label in built:
                return label
        return "dtensor"
    if "fsdp" in kinds or "fsdp" in built:
        return "fsdp"
    if "deepspeed" in built:
        return "deepspeed"
    if "ddp" in built:
        return "ddp"
    return "none" if distributed else "single"


def describe(optimizer: Any) -> dict[str, Any]:
    """The fields of the 'layout' note the first step sends."""
    import sys

    dist = sys.modules.get("torch.distributed")
    distributed = bool(dist is not None and dist.is_available() and dist.is_initialized())
    world = dist.get_world_size() if distributed and dist is not None else 1
    return {"applied": False, "own": own_layout(optimizer, _BUILT, distributed), "world": world}
