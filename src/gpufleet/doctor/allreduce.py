"""A real all-reduce across a node's workers: the worker (run under torchrun) and its launcher.

Each rank fills tensors of a few sizes with rank+1 and all-reduces them; every element must then
equal n(n+1)/2. A zero-filled buffer is then all-reduced a few times to time it (zeros stay zeros,
so the timing loop cannot overflow). The worker prints one line, RESULT_MARKER + JSON; the parent
(`run`) only collects torchrun's output and exit code, and `checks.allreduce` judges them.

`python -m gpufleet.doctor.allreduce` is the worker; importing this module does not import torch.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from gpufleet.doctor.model import RESULT_MARKER, AllReduceRun

TIMEOUT_S = 120.0  # the whole torchrun, start to exit; a hang is killed then
CHECK_NUMELS = (1, 2**20)  # float32 elements: 4 bytes and 4 MiB
TIMED_NUMEL = 2**20  # 4 MiB of float32
WARMUP_ITERS = 2
TIMED_ITERS = 10


def argv(workers: int, python: str = sys.executable) -> list[str]:
    """torchrun on one node; --standalone lets the rendezvous pick a free port itself."""
    return [python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(workers), "--max-restarts", "0",
            "-m", "gpufleet.doctor.allreduce"]


def run(workers: int, env: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> AllReduceRun:
    """Run the worker on `workers` ranks with `env` (GPUFLEET_BACKEND picks nccl or gloo) and
    wait at most `timeout_s` seconds; on timeout or interrupt the whole process tree is killed.

    Only processes started here are signalled: torchrun and its descendants, found by pid.
    """
    from gpufleet.backends.local import LocalBackend

    backend_name = env.get("GPUFLEET_BACKEND", "gloo")
    full_env = {**env, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="gpufleet-doctor-") as cwd:
        text, code = LocalBackend(cpu_slots=1).run_to_end(argv(workers), full_env, Path(cwd), timeout_s)
    return AllReduceRun(workers=workers, backend=backend_name, returncode=code,
                        timed_out=code is None, timeout_s=timeout_s, output=tuple(text.splitlines()))


def _worker() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    backend = os.environ.get("GPUFLEET_BACKEND", "gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timedelta(seconds=60), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    want = world * (world + 1) / 2
    sums = []
    for numel in CHECK_NUMELS:
        t = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(t)
        sums.append({"bytes": numel * 4, "want": want, "got_min": t.min().item(),
                     "got_max": t.max().item(), "wrong": int((t != want).sum().item())})

    buf = torch.zeros(TIMED_NUMEL, dtype=torch.float32, device=device)
    for _ in range(WARMUP_ITERS):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(TIMED_ITERS):
        dist.all_reduce(buf)
    sync()
    seconds = (time.perf_counter() - start) / TIMED_ITERS
    record = {"rank": rank, "world": world, "backend": backend, "device": str(device),
              "sums": sums, "timed_bytes": TIMED_NUMEL * 4, "iterations": TIMED_ITERS,
              "seconds_per_iter": seconds}
    # One write() of the whole line: ranks share torchrun's stdout pipe, and a write under
    # PIPE_BUF (4 KiB) is atomic there, where print's separate "\n" could interleave.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (RESULT_MARKER + json.dumps(record) + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker()
