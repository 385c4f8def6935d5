"""The in-worker SDK: `setup()` to join the job's process group, `prepare()` to apply the job's
strategy and precision, `report()` to show progress.

Scripts using it stay ordinary torchrun scripts: under bare `torchrun` (or plain `python`) the
calls work the same (plain DDP, fp32) and reports simply go nowhere. Importing this module does
not import torch; the functions that need it import it on first use.
"""

from __future__ import annotations

from typing import Any

from gpufleet.train.context import Context, cleanup, grad_accum_steps, setup
from gpufleet.train.report import report

_LAZY = {
    "prepare": "gpufleet.train.parallel",
    "prepared": "gpufleet.train.parallel",
    "forward_backward": "gpufleet.train.parallel",
    "evaluate": "gpufleet.train.parallel",
    "clip_grad_norm_": "gpufleet.train.parallel",
    "model_state_bytes": "gpufleet.train.memory",
    "full_state_dict": "gpufleet.train.checkpoint",
    "save_checkpoint": "gpufleet.train.checkpoint",
    "load_checkpoint": "gpufleet.train.checkpoint",
    "Checkpointer": "gpufleet.train.checkpointer",
}
_RENAMED = {"save_checkpoint": "save", "load_checkpoint": "load"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
    raise AttributeError(f"module 'gpufleet.train' has no attribute '{name}'")


__all__ = ["Context", "cleanup", "grad_accum_steps", "report", "setup", *_LAZY]
