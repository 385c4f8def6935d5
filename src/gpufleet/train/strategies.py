"""How `prepare` splits a model over the job's mesh, one function per method: DeepSpeed's
engine, pipeline stages (`split_for_pipeline`), tensor parallelism (`tensor_parallel_plan`),
FSDP2 / replicate / DDP over the data-parallel dimension, ZeRO-1's optimizer, and the
optimizer pointed at the parameters each rank now holds. The pipelining schedule is built here
too, once the stage and the precision are known."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from gpufleet.parallelism import Layout
from gpufleet.train import telemetry
from gpufleet.train.data import shard_loader
from gpufleet.train.record import RECORD, LossFn, Prepared


def deepspeed(model: nn.Module, optimizer: Any, loader: DataLoader[Any] | None,
               loss_fn: LossFn | None, layout: Layout,
               device: torch.device) -> tuple[nn.Module, Any, DataLoader[Any] | None]:
    """Hand the model to DeepSpeed's engine with the job's generated config: ZeRO from the
    strategy, bf16/fp16 from the precision, the script's own optimizer."""
    import json
    import warnings

    import deepspeed

    # DeepSpeed still calls collectives torch 2.13 deprecates; one warning per call, every step.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed.c10d_logger")
    if device.type == "cpu":
        # On CPU, DeepSpeed JIT-compiles a shared-memory all-reduce (about 80 s on first use) for
        # inference; training reduces through gloo anyway. Without it, nothing is compiled.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

    from gpufleet.launch.frameworks import deepspeed_config, with_micro_batch

    path = os.environ.get("GPUFLEET_DEEPSPEED_CONFIG")
    config = json.loads(Path(path).read_text()) if path else deepspeed_config(layout)
    if loader is not None and loader.batch_size:  # what each worker really takes per step
        config = with_micro_batch(config, loader.batch_size, layout.dp)
    engine, ds_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                      config=config)
    rec = Prepared(layout=layout, model=engine, optimizer=ds_optimizer, loss_fn=loss_fn,
                   device=device, extra={"deepspeed": engine})
    rank = dist.get_rank() if dist.is_initialized() else 0
    wrapped = _DeepSpeedOptimizer(engine)
    rec.optimizer = wrapped
    object.__setattr__(engine, RECORD, rec)
    if loader is not None:
        loader = shard_loader(loader, layout.dp, rank)
    return engine, wrapped, loader


class _DeepSpeedOptimizer:
    """The optimizer a script sees under DeepSpeed: `step()` is the engine's step (which also
    clips, unscales and zeroes gradients), so the ordinary loop stays as it is."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine.optimizer, name)

    @property
    def param_groups(self) -> Any:
        return self._engine.optimizer.param_groups

    def step(self, closure: Any = None) -> None:
        self._engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # engine.step() already did


def parameter_names(model: nn.Module, optimizer: Any, layout: Layout) -> dict[int, str]:
    """Each parameter's name, refusing what sharding would silently stop training: optimizer
    parameters that are not the model's, and weights shared by two modules when the modules
    may land on different ranks (pipeline stages, tensor-parallel shards)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    if layout.world_size > 1:
        foreign = sum(1 for g in optimizer.param_groups for p in g["params"] if id(p) not in names)
        if foreign:
            raise ValueError(f"{foreign} optimizer parameter(s) are not parameters of the model; "
                             "prepare() can only shard the model's own parameters")
    if layout.pp > 1 or layout.tp > 1:
        tied = [" = ".join(n) for n in names.values() if len(n) > 1]
        if tied:
            raise ValueError(f"tied weights ({'; '.join(tied)}) cannot be split over pipeline stages "
                             "or tensor-parallel ranks; untie them (give each module its own)")
    return {key: n[0] for key, n in names.items()}


def split(model: nn.Module, stage: int, stages: int) -> nn.Module:
    split = getattr(model, "split_for_pipeline", None)
    if split is None:
        raise ValueError(f"{type(model).__name__} has no split_for_pipeline(stage, stages) method; "
                         "pipeline parallelism needs the model to say where its stages begin")
    part = split(stage, stages)
    if not isinstance(part, nn.Module):
        raise TypeError("split_for_pipeline must return an nn.Module")
    return part


def tensor_parallel(module: nn.Module, tp_mesh: Any) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan_fn = getattr(module, "tensor_parallel_plan", None)
    if plan_fn is None:
        raise ValueError(f"{type(module).__name__} has no tensor_parallel_plan() method; tensor "
                         "parallelism needs to know which linears split by column and by row")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan: dict[str, Any] = {}
    for name, style in plan_fn().items():
        if isinstance(style, str):
            if style not in styles:
                raise ValueError(f"tensor_parallel_plan: '{style}' for {name}; allowed: colwise, rowwise")
            style = styles[style]()
        plan[name] = style
    present = dict(module.named_modules())
    # A pipeline stage holds only some blocks, so entries for the others are skipped; but a plan
    # that matches nothing would leave every rank computing everything, unsplit.
    matched = {name: style for name, style in plan.items() if name in present}
    if not matched:
        raise ValueError(f"tensor_parallel_plan of {type(module).__name__} names no module it has "
                         f"(e.g. {next(iter(plan), 'nothing')}); use names from named_modules()")
    parallelize_module(module, tp_mesh, matched)


def data_parallel(module: nn.Module, rec: Prepared) -> nn.Module:
    layout = rec.layout
    kind = layout.data_parallel
    if kind in ("fsdp", "zero2", "zero3"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kwargs: dict[str, Any] = {"mesh": rec.mesh["dp"],
                                  "reshard_after_forward": kind != "zero2"}
        if layout.precision == "bf16-mixed":
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                       reduce_dtype=torch.float32)
        # Shard each block on its own so only one block is gathered at a time, then the rest.
        for child in _blocks(module):
            fully_shard(child, **kwargs)
        fully_shard(module, **kwargs)
        rec.extra["fsdp"] = True
        return module
    if layout.tp > 1 or layout.pp > 1:
        # DDP's reducer expects one forward per backward; pipeline microbatches and DTensor
        # parameters need FSDP2's replicate, which all-reduces gradients the same way.
        from torch.distributed._composable.replicate_with_fsdp import replicate

        replicate(module, mesh=rec.mesh["dp"])
        rec.extra["replicate"] = True
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [rec.device.index] if rec.device.type == "cuda" else None
    group = rec.mesh["dp"].get_group() if rec.mesh is not None else None
    ddp = DistributedDataParallel(module, device_ids=ids, process_group=group)
    if telemetry.ENABLED:
        telemetry.install_comm_hook(ddp, group)
    return ddp


def _blocks(module: nn.Module) -> list[nn.Module]:
    """The repeated layers, to shard one at a time: the children of the ModuleList/Sequential
    whose children are all of one type and hold the most parameters (a transformer's blocks,
    not an MLP's Linear-GELU-Linear)."""
    best: list[nn.Module] = []
    best_size = 0
    for child in module.modules():
        if not isinstance(child, nn.ModuleList | nn.Sequential) or not len(child):
            continue
        layers = list(child)
        if len({type(layer) for layer in layers}) != 1:
            continue
        size = sum(p.numel() for p in child.parameters())
        if size > best_size:
            best, best_size = layers, size
    return best


def rebuild_optimizer(optimizer: Any, names: dict[int, str], module: nn.Module) -> Any:
    """Point the user's optimizer at the parameters this rank now holds, in place.

    Sharding replaces parameters (FSDP2 and TP swap in DTensors, a pipeline stage keeps only
    some), so the optimizer's groups are rebuilt by parameter name, keeping each group's settings.
    A group with no parameters on this stage stays, empty, so group indices (which learning-rate
    schedulers use) mean the same on every rank.
    """
    if optimizer.state:
        raise ValueError("prepare() needs an optimizer that has not stepped yet")
    now = {_clean(n): p for n, p in module.named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        params = [now[_clean(names[id(p)])] for p in group["params"]
                  if id(p) in names and _clean(names[id(p)]) in now]
        groups.append({**group, "params": params})
    optimizer.param_groups = groups
    return optimizer


def _clean(name: str) -> str:
    return name.removeprefix("module.")


def zero1(optimizer: Any, rec: Prepared) -> Any:
    """ZeroRedundancyOptimizer over the user's parameter groups, each with its own settings
    (e.g. no weight decay on biases), built with the same optimizer class and defaults."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    accepted = inspect.signature(type(optimizer).__init__).parameters
    opts = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
    groups = [dict(g) for g in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer),
                                   process_group=rec.mesh["dp"].get_group(), **opts)


def build_schedule(rec: Prepared) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    assert rec.loss_fn is not None
    stage = PipelineStage(rec.model, rec.stage_index, rec.layout.pp, rec.device,
                          group=rec.pp_group)
    loss_fn = rec.loss_fn
    scaler = rec.scaler

    def staged_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(output, target)
        return loss * scaler.scale if scaler is not None else loss

    cls = ScheduleGPipe if rec.layout.schedule == "gpipe" else Schedule1F1B
    rec.schedule = cls(stage, n_microbatches=rec.layout.microbatches, loss_fn=staged_loss)
