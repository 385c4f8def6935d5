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
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from gpufleet.parallelism import Layout
from gpufleet.train import telemetry
from gpufleet.train.data import shard_loader

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


@dataclass
class Prepared:
    """What `prepare` built for one model; `forward_backward` and friends look it up."""

    layout: Layout
    model: nn.Module
    optimizer: Any
    loss_fn: LossFn | None
    device: torch.device
    mesh: Any = None  # DeviceMesh when the job has more than one rank
    scaler: Any = None  # GradScaler for fp16-mixed
    schedule: Any = None  # pipelining schedule under pp
    stage_index: int = 0
    dp_rank: int = 0
    pp_group: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_last_stage(self) -> bool:
        return self.stage_index == self.layout.pp - 1


_RECORD = "_gpufleet_prepared"  # the attribute that ties a prepared model to its record


def record_of(model: nn.Module) -> Prepared | None:
    """The record `prepare` attached to this model, or None for a model it did not return."""
    rec = getattr(model, _RECORD, None)
    return rec if isinstance(rec, Prepared) else None


def prepared(model: nn.Module) -> Prepared:
    """The record for a model returned by `prepare`: its layout, optimizer, schedule."""
    rec = record_of(model)
    if rec is None:
        raise ValueError("this model did not come from gpufleet.train.prepare")
    return rec


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
        return _deepspeed(model, optimizer, loader, loss_fn, layout, device)
    names = _parameter_names(model, optimizer, layout)  # before sharding replaces them
    rec = Prepared(layout=layout, model=model, optimizer=optimizer, loss_fn=loss_fn, device=device)
    if world > 1:
        rec.mesh = _mesh(device.type, layout)
        rec.dp_rank = rec.mesh["dp"].get_local_rank()
        rec.stage_index = rec.mesh["pp"].get_local_rank()
        rec.pp_group = rec.mesh["pp"].get_group()

    module = model
    if layout.pp > 1:
        module = _split(model, rec.stage_index, layout.pp)
    if layout.tp > 1:
        _tensor_parallel(module, rec.mesh["tp"])
    if layout.dp > 1:
        module = _data_parallel(module, rec)
    if world > 1:
        optimizer = _rebuild_optimizer(optimizer, names, module)
    if layout.data_parallel == "zero1" and layout.dp > 1:
        optimizer = _zero1(optimizer, rec)
    rec.model, rec.optimizer = module, optimizer
    if layout.precision != "fp32":
        _apply_precision(rec)
    if layout.pp > 1:
        _build_schedule(rec)
    object.__setattr__(module, _RECORD, rec)  # not a submodule or buffer: plain attribute
    optimizer = _StepOptimizer(optimizer, rec) if rec.scaler is not None else optimizer
    rec.optimizer = optimizer
    if loader is not None:
        loader = shard_loader(loader, layout.dp, rec.dp_rank)
    return module, optimizer, loader


# --- strategies ------------------------------------------------------------------------------

def _deepspeed(model: nn.Module, optimizer: Any, loader: DataLoader[Any] | None,
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
    object.__setattr__(engine, _RECORD, rec)
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


def _parameter_names(model: nn.Module, optimizer: Any, layout: Layout) -> dict[int, str]:
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


def _split(model: nn.Module, stage: int, stages: int) -> nn.Module:
    split = getattr(model, "split_for_pipeline", None)
    if split is None:
        raise ValueError(f"{type(model).__name__} has no split_for_pipeline(stage, stages) method; "
                         "pipeline parallelism needs the model to say where its stages begin")
    part = split(stage, stages)
    if not isinstance(part, nn.Module):
        raise TypeError("split_for_pipeline must return an nn.Module")
    return part


def _tensor_parallel(module: nn.Module, tp_mesh: Any) -> None:
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


def _data_parallel(module: nn.Module, rec: Prepared) -> nn.Module:
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


def _rebuild_optimizer(optimizer: Any, names: dict[int, str], module: nn.Module) -> Any:
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


def _zero1(optimizer: Any, rec: Prepared) -> Any:
    """ZeroRedundancyOptimizer over the user's parameter groups, each with its own settings
    (e.g. no weight decay on biases), built with the same optimizer class and defaults."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    accepted = inspect.signature(type(optimizer).__init__).parameters
    opts = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
    groups = [dict(g) for g in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer),
                                   process_group=rec.mesh["dp"].get_group(), **opts)


# --- precision -------------------------------------------------------------------------------

class LossScaler:
    """Dynamic loss scaling for fp16, as torch.amp.GradScaler does it, over local shards.

    GradScaler cannot unscale a mix of DTensor and plain gradients (tensor parallelism has
    both), and each rank sees only its shard or stage, so an overflow on one rank must skip the
    step on all: the inf flag is all-reduced. The arithmetic is torch's own fused amp ops.
    """

    def __init__(self, device: torch.device, init_scale: float = 2.0**16,
                 growth_interval: int = 2000) -> None:
        self.scale = torch.full((), init_scale, dtype=torch.float32, device=device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self._found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self.growth_interval = growth_interval
        self.unscaled = False
        self.skipped_steps = 0

    def state_dict(self) -> dict[str, float]:
        """The scale and its growth counter, so a resumed fp16 run does not restart at 2^16."""
        return {"scale": float(self.scale.item()), "growth_tracker": int(self._growth_tracker.item()),
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale.fill_(float(state["scale"]))
        self._growth_tracker.fill_(int(state["growth_tracker"]))
        self.skipped_steps = int(state["skipped_steps"])

    def unscale_(self, params: list[torch.Tensor]) -> None:
        if self.unscaled:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            if p.grad is not None:
                local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                by_dtype.setdefault(local.dtype, []).append(local)
        self._found_inf.zero_()
        inv = self.scale.double().reciprocal().float()
        for grads in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, self._found_inf, inv)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(self._found_inf, op=dist.ReduceOp.MAX)
        self.unscaled = True

    def step(self, optimizer: Any, params: list[torch.Tensor]) -> Any:
        self.unscale_(params)
        result = None
        if self._found_inf.item() == 0:  # waits for the device: reading the scale is free now
            result = optimizer.step()
        else:
            self.skipped_steps += 1
        telemetry.COUNTERS.skipped_steps = self.skipped_steps
        telemetry.COUNTERS.loss_scale = float(self.scale.item())
        torch._amp_update_scale_(self.scale, self._growth_tracker, self._found_inf,
                                 2.0, 0.5, self.growth_interval)
        self.unscaled = False
        return result


def _apply_precision(rec: Prepared) -> None:
    dtype = _DTYPES[rec.layout.precision]
    if rec.layout.precision == "fp16-mixed":
        rec.scaler = LossScaler(rec.device)
    if rec.extra.get("fsdp") and dtype == torch.bfloat16:
        return  # FSDP's mixed-precision policy computes in bf16 already
    module, device_type, scaler = rec.model, rec.device.type, rec.scaler
    inner_forward = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            out = inner_forward(*args, **kwargs)
        if scaler is not None and rec.layout.pp == 1 and torch.is_grad_enabled() \
                and not rec.extra.get("scaling_loss"):
            # A plain `loss.backward()`: scale the gradient entering the model, which is scaling
            # the loss (backward is linear). forward_backward scales the loss itself instead,
            # before any fp16 cast, which keeps the smallest gradients.
            if not isinstance(out, torch.Tensor):
                raise TypeError("fp16-mixed with a model that returns "
                                f"{type(out).__name__}: use train.forward_backward(), which "
                                "scales the loss")
            if out.requires_grad:
                out.register_hook(lambda grad: (grad.float() * scaler.scale).to(grad.dtype))
        return out

    module.forward = forward  # type: ignore[method-assign]


class _StepOptimizer:
    """The user's optimizer, stepping through the fp16 loss scaler."""

    def __init__(self, inner: Any, rec: Prepared) -> None:
        self._inner, self._rec = inner, rec
        telemetry.COUNTERS.skipped_steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def step(self, closure: Any = None) -> Any:
        return self._rec.scaler.step(self._inner, _params(self._inner))


def _params(optimizer: Any) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


# --- pipeline --------------------------------------------------------------------------------

def _build_schedule(rec: Prepared) -> None:
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
