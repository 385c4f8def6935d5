"""Mixed precision for a prepared model: bf16 through autocast, fp16 with dynamic loss scaling
over local shards (`LossScaler`) and the optimizer that steps through it."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gpufleet.train import telemetry
from gpufleet.train.record import Prepared

_DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


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


def apply_precision(rec: Prepared) -> None:
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


class StepOptimizer:
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
