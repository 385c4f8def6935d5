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


def grad_accum_steps() -> int:
    """Micro-batches each rank accumulates per optimizer step (1 unless gpufleet says more).

    An elastic job keeps its global batch when it runs on fewer workers: on half the workers,
    each accumulates two micro-batches. Divide the loss by this (`forward_backward(...,
    loss_scale=1 / n)`) and step the optimizer once per n micro-batches.
    """
    try:
        return max(1, int(os.environ.get("GPUFLEET_GRAD_ACCUM", "1")))
    except ValueError:
        return 1


def _end_with_parent() -> None:
    """Ask the kernel to kill this worker when its parent (torchrun's agent) dies, however it
    dies: a worker left running after its job is gone would hold a device and the job's port."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent was already gone before we asked
            os._exit(1)
    except (OSError, AttributeError):
        pass


def setup(timeout_s: float = 600.0, verify: bool = True) -> Context:
    """Initialise torch.distributed from torchrun's environment and return where this rank runs.

    On GPUs the group is 'cpu:gloo,cuda:nccl' so CPU tensors (e.g. for async checkpoints) also
    have a backend. With `verify`, one tiny all-reduce checks that every rank can talk to every
    other before training starts, so a broken network fails here with a clear message rather
    than minutes later inside the first backward pass.
    """
    import torch
    import torch.distributed as dist

    _end_with_parent()
    if "RANK" not in os.environ and "HOROVOD_RANK" in os.environ:  # started by horovodrun
        os.environ.update({"RANK": os.environ["HOROVOD_RANK"],
                           "WORLD_SIZE": os.environ.get("HOROVOD_SIZE", "1"),
                           "LOCAL_RANK": os.environ.get("HOROVOD_LOCAL_RANK", "0")})
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

    The same abort can still come later, from C++ objects that sharded models keep (FSDP's
    groups, pipeline sends) being destroyed while the interpreter shuts down: about 1 run in 16
    of FSDP on 4 gloo ranks here, after training had finished. So once the group is left, a
    process that then ends normally skips that last teardown: after the other exit handlers
    and a flush, it exits with status 0. An uncaught exception still exits 1 as usual; a
    `sys.exit(code)` after cleanup() exits 0, so make cleanup() the script's last call.

    A warm rank (the default) keeps the groups left here, as every group a script leaves,
    until it ends (launch/warm_rank.py): a DDP model freed after this, at `main()`'s return,
    would otherwise free its gloo group and could wait forever in its destructor.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        _exit_cleanly_after_this()


_exit_state = {"armed": False, "failed": False}


def _exit_cleanly_after_this() -> None:
    import atexit

    if _exit_state["armed"]:
        return
    _exit_state["armed"] = True
    previous_hook = sys.excepthook

    def note_failure(*args: Any) -> None:
        _exit_state["failed"] = True
        previous_hook(*args)

    sys.excepthook = note_failure

    def exit_now() -> None:
        if _exit_state["failed"]:
            return
        # atexit runs the last registered handler first, so this one would go before earlier
        # ones (logging's flush, the user's): run them now, then leave without the teardown.
        atexit.unregister(exit_now)
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(0)

    atexit.register(exit_now)
