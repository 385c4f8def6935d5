"""Joining the process group with the backend the job's devices need."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class Context:
    rank: int
    local_rank: int
    world_size: int
    device: Any  # torch.device
    backend: str  # "nccl" or "gloo" ("none" for a single process without torchrun)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _pick_backend(torch: Any) -> tuple[str, str]:
    """(device kind, backend): the supervisor says via GPUFLEET_*; under bare torchrun, we look."""
    kind = os.environ.get("GPUFLEET_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = os.environ.get("GPUFLEET_BACKEND") or ("nccl" if kind == "cuda" else "gloo")
    return kind, backend


def setup(timeout_s: float = 600.0, verify: bool = True) -> Context:
    """Initialise torch.distributed from torchrun's environment and return where this rank runs.

    On GPUs the group is 'cpu:gloo,cuda:nccl' so CPU tensors (e.g. for async checkpoints) also
    have a backend. With `verify`, one tiny all-reduce checks that every rank can talk to every
    other before training starts, so a broken network fails here with a clear message rather
    than minutes later inside the first backward pass.
    """
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    kind, backend = _pick_backend(torch)
    device = torch.device(f"cuda:{local_rank}") if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    if "RANK" not in os.environ:  # plain `python script.py`: one process, no group needed
        return Context(0, 0, 1, device, "none")
    if not dist.is_initialized():
        group_backend = "cpu:gloo,cuda:nccl" if backend == "nccl" else backend
        kwargs: dict[str, Any] = {"backend": group_backend, "timeout": timedelta(seconds=timeout_s)}
        if kind == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    if verify:
        probe = torch.tensor([float(rank + 1)], device=device)
        dist.all_reduce(probe)
        expected = world * (world + 1) / 2
        if abs(probe.item() - expected) > 1e-6:
            raise RuntimeError(
                f"all-reduce check failed on rank {rank}: got {probe.item()}, expected {expected}"
            )
        if rank == 0:
            print(f"gpufleet: {world} ranks joined over {backend}; all-reduce check passed "
                  f"({probe.item():g} == {expected:g})", file=sys.stderr, flush=True)
    return Context(rank, local_rank, world, device, backend)


def cleanup() -> None:
    """Leave the process group (if any) so the process exits without torch's warning.

    Collective: every rank calls it. The barrier first makes ranks tear down together; a rank
    that destroys its gloo group while a peer is still busy (say, rank 0 printing a sample) can
    abort with 'terminate called without an active exception' (seen about 1 run in 6 here).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
