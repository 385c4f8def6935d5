"""`prepare`: apply the job's strategy and precision to an ordinary model, optimizer and loader.

Everything here is PyTorch's own machinery, chosen by the job's `Layout`:

- ddp: `DistributedDataParallel`; zero1: DDP plus `ZeroRedundancyOptimizer`;
- zero2 / zero3 / fsdp: FSDP2 `fully_shard`, resharding after forward only for zero3 and fsdp;
- tp: DTensor tensor parallelism from the model's `tensor_parallel_plan()`;
- pp: `torch.distributed.pipelining` (GPipe or 1F1B) over the model's `split_for_pipeline()`;
- meshes combine them through one `DeviceMesh` (pp, dp, tp).

Precision: bf16 via autocast, or FSDP's mixed-precision policy when the model is sharded; fp16
adds a gradient scaler. The training loop stays the same for every strategy:

    loss = train.forward_backward(model, x, y)   # forward, loss, backward (pipelined under pp)
    train.clip_grad_norm_(model, 1.0)           # optional; right for sharded and staged models
    optimizer.step(); optimizer.zero_grad()

Without pipeline parallelism, `loss = loss_fn(model(x), y); loss.backward()` works as well.

This module is the SDK's face (`prepare` and the loop's calls); the record it keeps is in
`record.py`, each method of splitting the model in `strategies.py`, precision in
`precision.py`.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from gpufleet.parallelism import Layout
from gpufleet.train.data import shard_loader
from gpufleet.train.precision import StepOptimizer, apply_precision
from gpufleet.train.record import RECORD, LossFn, Prepared, prepared, record_of
from gpufleet.train.strategies import (
    build_schedule,
    data_parallel,
    deepspeed,
    parameter_names,
    rebuild_optimizer,
    split,
    tensor_parallel,
    zero1,
)

__all__ = ["LossFn", "Prepared", "clip_grad_norm_", "evaluate", "forward_backward", "prepare",
           "prepared", "record_of"]


_MESHES: dict[tuple[Any, ...], Any] = {}


def _mesh(device_type: str, layout: Layout) -> Any:
    """The (pp, dp, tp) DeviceMesh, made once per shape and process group: each new mesh makes
    new process groups, and with gloo every group keeps its own connections and threads."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (id(dist.group.WORLD), device_type, layout.pp, layout.dp, layout.tp)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device_type, (layout.pp, layout.dp, layout.tp),
                                        mesh_dim_names=("pp", "dp", "tp"))
    return _MESHES[key]


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def prepare(model: nn.Module, optimizer: Any, loader: DataLoader[Any] | None = None, *,
            loss_fn: LossFn | None = None, layout: Layout | None = None,
            device: torch.device | None = None) -> tuple[nn.Module, Any, DataLoader[Any] | None]:
    """Wrap `model`, `optimizer` and `loader` for the job's layout (from its environment unless
    `layout` is given). Call after `train.setup()`, with the optimizer built on `model`'s
    parameters. Returns replacements for all three; use them, not the originals."""
    from gpufleet.train.report import SDK, send_event

    world = _world_size()
    layout = layout or Layout.from_env(dict(os.environ), world)
    SDK.used = True  # the worker bootstrap stops counting steps: the script reports
    send_event("layout", applied=True, layout=layout.describe, world=world)
    if layout.world_size != world:
        raise ValueError(f"layout {layout.describe} needs {layout.world_size} ranks; "
                         f"the process group has {world}")
    device = device or next(model.parameters()).device
    if layout.pp > 1 and loss_fn is None:
        raise ValueError("pipeline parallelism computes the loss inside the schedule: "
                         "pass loss_fn= to prepare")
    if layout.framework == "deepspeed":
        return deepspeed(model, optimizer, loader, loss_fn, layout, device)
    names = parameter_names(model, optimizer, layout)  # before sharding replaces them
    rec = Prepared(layout=layout, model=model, optimizer=optimizer, loss_fn=loss_fn, device=device)
    if world > 1:
        rec.mesh = _mesh(device.type, layout)
        rec.dp_rank = rec.mesh["dp"].get_local_rank()
        rec.stage_index = rec.mesh["pp"].get_local_rank()
        rec.pp_group = rec.mesh["pp"].get_group()

    module = model
    if layout.pp > 1:
        module = split(model, rec.stage_index, layout.pp)
    if layout.tp > 1:
        tensor_parallel(module, rec.mesh["tp"])
    if layout.dp > 1:
        module = data_parallel(module, rec)
    if world > 1:
        optimizer = rebuild_optimizer(optimizer, names, module)
    if layout.data_parallel == "zero1" and layout.dp > 1:
        optimizer = zero1(optimizer, rec)
    rec.model, rec.optimizer = module, optimizer
    if layout.precision != "fp32":
        apply_precision(rec)
    if layout.pp > 1:
        build_schedule(rec)
    object.__setattr__(module, RECORD, rec)  # not a submodule or buffer: plain attribute
    optimizer = StepOptimizer(optimizer, rec) if rec.scaler is not None else optimizer
    rec.optimizer = optimizer
    if loader is not None:
        loader = shard_loader(loader, layout.dp, rec.dp_rank)
    return module, optimizer, loader


# --- the loop --------------------------------------------------------------------------------

def forward_backward(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *,
                     loss_scale: float = 1.0) -> torch.Tensor:
    """One forward and backward pass on this rank's batch; returns the mean loss, detached.

    `loss_scale` multiplies the loss before backward only: 1/n when accumulating n
    micro-batches per optimizer step (`train.grad_accum_steps()`), so the gradient is the
    mean over the whole global batch. The returned loss is not scaled.

    Under pipeline parallelism the batch goes through the schedule in microbatches and every
    stage gets the loss (the last stage computes it and shares it along the pipeline).
    """
    rec = prepared(model)
    if rec.loss_fn is None:
        raise ValueError("forward_backward needs the loss: pass loss_fn= to prepare")
    if rec.layout.pp == 1:
        engine = rec.extra.get("deepspeed")
        if engine is not None and inputs.is_floating_point():
            inputs = inputs.to(next(engine.module.parameters()).dtype)  # DeepSpeed casts weights, not inputs
        if rec.scaler is None:
            loss = rec.loss_fn(model(inputs), targets)
            if engine is not None:
                engine.backward(loss * loss_scale)  # DeepSpeed scales, reduces and partitions itself
            else:
                (loss * loss_scale if loss_scale != 1.0 else loss).backward()
            return loss.detach()
        rec.extra["scaling_loss"] = True
        try:
            loss = rec.loss_fn(model(inputs), targets)
        finally:
            rec.extra["scaling_loss"] = False
        (loss.float() * (rec.scaler.scale * loss_scale)).backward()
        return loss.detach()
    if loss_scale != 1.0:
        raise ValueError("loss_scale (gradient accumulation) is not supported under pipeline "
                         "parallelism: raise --microbatches instead")
    if inputs.shape[0] % rec.layout.microbatches:
        raise ValueError(f"batch of {inputs.shape[0]} does not split into "
                         f"{rec.layout.microbatches} microbatches evenly")
    losses: list[torch.Tensor] = []
    first, last = rec.stage_index == 0, rec.is_last_stage
    rec.schedule.step(*((inputs,) if first else ()), target=targets if last else None,
                      losses=losses if last else None)
    return _share_loss(rec, losses)


@torch.no_grad()  # type: ignore[untyped-decorator]
def evaluate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean loss of a batch without gradients, for every strategy (pipelined under pp)."""
    rec = prepared(model)
    if rec.loss_fn is None:
        raise ValueError("evaluate needs the loss: pass loss_fn= to prepare")
    if rec.layout.pp == 1:
        return rec.loss_fn(model(inputs), targets).detach()
    losses: list[torch.Tensor] = []
    last = rec.is_last_stage
    rec.schedule.eval(*((inputs,) if rec.stage_index == 0 else ()),
                      target=targets if last else None, losses=losses if last else None)
    return _share_loss(rec, losses)


def _share_loss(rec: Prepared, losses: list[torch.Tensor]) -> torch.Tensor:
    value = torch.zeros((), device=rec.device)
    if rec.is_last_stage:
        value = torch.stack([loss.detach().float() for loss in losses]).mean()
        if rec.scaler is not None:
            value = value / rec.scaler.scale
    src = dist.get_global_rank(rec.pp_group, rec.layout.pp - 1)
    dist.broadcast(value, src=src, group=rec.pp_group)
    return value


def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip gradients by their norm over the whole model, wherever its pieces live.

    Sharded (FSDP, TP) gradients are DTensors whose norms combine across their mesh; pipeline
    stages hold disjoint parameters, so their squared norms add over the pipeline group; fp16
    gradients are unscaled first. Returns the total norm before clipping.
    """
    rec = record_of(model)
    engine = rec.extra.get("deepspeed") if rec is not None else None
    if engine is not None:
        # DeepSpeed clips inside engine.step(), with partitioned gradients only it can see:
        # tell it the limit and report the norm it measured on the last step.
        engine._config.gradient_clipping = max_norm
        if hasattr(engine.optimizer, "clip_grad"):
            engine.optimizer.clip_grad = max_norm
        norm = engine.get_global_grad_norm()
        return torch.tensor(float("nan") if norm is None else float(norm))
    if rec is not None and rec.scaler is not None:
        rec.scaler.unscale_(list(model.parameters()))
    # Group the local pieces by how they are sharded: (mesh, sharded mesh dims), () for plain.
    groups: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    for p in model.parameters():
        g = p.grad
        if g is None:
            continue
        key: tuple[Any, ...] = ()
        if hasattr(g, "device_mesh"):
            key = (g.device_mesh, tuple(i for i, pl in enumerate(g.placements) if pl.is_shard()))
            g = g.to_local()
        groups.setdefault(key, []).append(g.detach())
    locals_ = [g for group in groups.values() for g in group]
    device = locals_[0].device if locals_ else torch.device("cpu")
    # Squares summed per group in one fused op, then over the mesh dims the group is sharded on
    # (one all-reduce each); replicated pieces count once.
    total_sq = torch.zeros((), device=device)
    for key, group in groups.items():
        sq = torch.stack([n.float() for n in torch._foreach_norm(group)]).pow(2).sum()
        if key:
            mesh, dims = key
            for dim in dims:
                dist.all_reduce(sq, group=mesh.get_group(dim))
        total_sq = total_sq + sq
    if rec is not None and rec.layout.pp > 1:
        dist.all_reduce(total_sq, group=rec.pp_group)
    total = total_sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    if locals_:
        torch._foreach_mul_(locals_, coef.to(locals_[0].dtype))
    return total
