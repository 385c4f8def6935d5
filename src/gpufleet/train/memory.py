"""What each rank holds of the model's state, so sharding can be seen and the planner checked.

Counts the bytes of the tensors this rank owns: its shard of each DTensor (FSDP, TP), only its
stage's parameters under pipeline parallelism, only its partition of the optimizer state under
ZeRO-1. Activations and temporary all-gather buffers are not model state and are left out; on a
GPU `cuda_max_allocated_bytes` gives the peak of everything together.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _param_tensors(params: list[torch.Tensor]) -> Iterable[torch.Tensor]:
    for p in params:
        yield p
        # DeepSpeed ZeRO-3 keeps this rank's partition beside the (usually released) full tensor.
        partition = getattr(p, "ds_tensor", None)
        if isinstance(partition, torch.Tensor):
            yield partition


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        local = _local(t)
        key = local.data_ptr() if local.numel() else id(local)
        if key in seen:
            continue
        seen.add(key)
        total += local.numel() * local.element_size()
    return total


def _optimizer_states(optimizer: Any) -> Iterable[torch.Tensor]:
    inner = getattr(optimizer, "_inner", optimizer)  # fp16 step wrapper
    engine = getattr(optimizer, "_engine", None)  # DeepSpeed: its ZeRO optimizer wraps torch's
    if engine is not None:
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    inner = getattr(inner, "optim", inner)  # ZeroRedundancyOptimizer keeps its shard's optimizer
    for state in inner.state.values():
        for value in state.values():
            # Scalar step counters are bookkeeping, not state that scales with the model.
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                yield value


def model_state_bytes(model: nn.Module, optimizer: Any = None) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state held by this rank (not the world).

    Call after an optimizer step: optimizers such as Adam create their state on the first step.
    """
    params = list(model.parameters())
    out = {
        "params_bytes": _bytes(_param_tensors(params)),
        "grads_bytes": _bytes(p.grad for p in params if p.grad is not None),
        "optimizer_bytes": _bytes(_optimizer_states(optimizer)) if optimizer is not None else 0,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    return out
