"""What `prepare` built for one model, tied to the model it returned: the record every other
part of the SDK (the loop, the checkpoints) looks up. No process group is touched here.

(Not named `prepared.py`: `gpufleet.train.prepared` is the SDK's function, which a submodule of
that name would shadow once imported.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpufleet.parallelism import Layout

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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


RECORD = "_gpufleet_prepared"  # the attribute that ties a prepared model to its record


def record_of(model: nn.Module) -> Prepared | None:
    """The record `prepare` attached to this model, or None for a model it did not return."""
    rec = getattr(model, RECORD, None)
    return rec if isinstance(rec, Prepared) else None


def prepared(model: nn.Module) -> Prepared:
    """The record for a model returned by `prepare`: its layout, optimizer, schedule."""
    rec = record_of(model)
    if rec is None:
        raise ValueError("this model did not come from gpufleet.train.prepare")
    return rec
