"""Checkpoints that load under another strategy or world size, through Distributed Checkpoint.

Each rank writes the shards it holds, keyed by parameter name (the names a plain, unwrapped
model has); loading reads whatever slices the new layout needs. So a run saved under DDP on 2
ranks resumes under FSDP on 4, or under pipeline stages, with the same weights and Adam moments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from gpufleet.train.record import record_of


def inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer under gpufleet's wrappers; ValueError for zero1, whose
    ZeroRedundancyOptimizer has no sharded state dict."""
    inner = getattr(optimizer, "_inner", optimizer)
    if type(inner).__name__ == "ZeroRedundancyOptimizer":
        raise ValueError("checkpoints of zero1 jobs are not supported: ZeroRedundancyOptimizer "
                         "has no sharded state dict; use zero2 (same memory for optimizer state)")
    return inner


def engine_of(model: nn.Module) -> Any:
    """The DeepSpeed engine when `prepare` handed the model to DeepSpeed, else None."""
    rec = record_of(model)
    return rec.extra.get("deepspeed") if rec is not None else None


def save(path: str | Path, model: nn.Module, optimizer: Any = None, *, step: int = 0) -> None:
    """Write a checkpoint folder at `path`; collective (every rank calls it).

    Under DeepSpeed this is DeepSpeed's own checkpoint format (its engine owns the partitioned
    optimizer state), which loads back under DeepSpeed.
    """
    engine = engine_of(model)
    if engine is not None:
        engine.save_checkpoint(str(path), tag="gpufleet", client_state={"step": step})
        return
    state = model_state(model, optimizer)
    state["meta"] = {"step": step}
    dcp.save(state, checkpoint_id=str(path))


def load(path: str | Path, model: nn.Module, optimizer: Any = None) -> int:
    """Load a checkpoint written by `save` into this (prepared) model and optimizer, resharding
    as needed; returns the step it was saved at. Collective."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"no checkpoint at {path}")
    engine = engine_of(model)
    if engine is not None:
        _, client = engine.load_checkpoint(str(path), tag="gpufleet",
                                           load_optimizer_states=optimizer is not None)
        return int((client or {}).get("step", 0))
    state = model_state(model, optimizer)
    state["meta"] = {"step": 0}
    dcp.load(state, checkpoint_id=str(path))
    apply_model_state(model, optimizer, state)
    return int(state["meta"]["step"])


def model_state(model: nn.Module, optimizer: Any = None) -> dict[str, Any]:
    """The model's (and optimizer's) state keyed by plain parameter names, as DCP saves it."""
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, inner_optimizer(optimizer))
    return {"model": model_sd, "optimizer": optim_sd}


def apply_model_state(model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    """Put a loaded `model_state` back into the (prepared) model and optimizer."""
    if optimizer is None:
        set_state_dict(model, (), model_state_dict=state["model"], optim_state_dict={})
        return
    inner = inner_optimizer(optimizer)
    before = [{k: v for k, v in g.items() if k != "params"} for g in inner.param_groups]
    set_state_dict(model, inner, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    # A group with no parameters on this rank (a pipeline stage without embeddings, say)
    # gets nothing back from the checkpoint, not even its settings: keep the ones it had.
    for group, settings in zip(inner.param_groups, before, strict=False):
        for key, value in settings.items():
            group.setdefault(key, value)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain CPU tensors on rank 0 (empty elsewhere): for sampling
    or export from a sharded or pipelined model. Collective."""
    engine = engine_of(model)
    if engine is not None:
        if engine.zero_optimization_partition_weights():  # ZeRO-3: gather the partitions
            whole = engine._zero3_consolidated_16bit_state_dict() or {}
        else:
            whole = engine.module.state_dict()
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
        return {k: v.detach().float().cpu() for k, v in whole.items()} if rank0 else {}
    rec = record_of(model)
    if rec is None or rec.layout.pp == 1:
        # One copy, gathered into rank 0's CPU memory only.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return dict(get_model_state_dict(model, options=options))
    # Pipeline stages hold different layers: each stage's first replica sends its part to rank 0.
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    mesh = rec.mesh
    first_replica = mesh["dp"].get_local_rank() == 0 and mesh["tp"].get_local_rank() == 0
    mine = {k: v.detach().cpu() for k, v in whole.items()} if first_replica else {}
    parts: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object(mine, parts if dist.get_rank() == 0 else None, dst=0)
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part or {})
    return merged
