"""A small DDP training job that can provoke each diagnosis for real, on CPU workers.

--data-delay S   every batch takes S seconds to load (a slow data pipeline)
--straggle S     rank --straggle-rank spends S extra seconds computing each step
--stall-after N  after step N every rank sleeps --stall-s seconds without reporting, or, with
                 --stall-gate FILE, until FILE exists (the test makes it once it has seen the
                 stall diagnosed, so no supervisor slowed by load can miss a short stall)
--oom-after N    after step N rank 1 caps its address space and allocates past it (the CPU
                 allocator's own out-of-memory error)
--timeout-after N  after step N rank 1 sleeps past the process group's timeout while rank 0
                 waits in an all-reduce (gloo reports the collective timing out)
--wide D         model width: a wide model and a tiny batch make communication dominate
--sync-mb M      with more than one worker, every step also all-reduces an M MB buffer: a job
                 that communicates many times what it computes, so it scales poorly by a factor
                 (on loopback an all-reduce moves memory about as fast as an optimizer step,
                 so a model's own gradients alone make communication a margin, not a factor)
--lr / --precision-nan: a learning rate high enough that fp16 overflows
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpufleet import train


class Slow(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, dim: int, delay_s: float, batch: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.delay_per_item = delay_s / batch

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_per_item:
            time.sleep(self.delay_per_item)
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--wide", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--data-delay", type=float, default=0.0)
    p.add_argument("--straggle", type=float, default=0.0)
    p.add_argument("--straggle-rank", type=int, default=1)
    p.add_argument("--stall-after", type=int, default=0)
    p.add_argument("--stall-s", type=float, default=0.0)
    p.add_argument("--stall-gate", type=Path, default=None)
    p.add_argument("--oom-after", type=int, default=0)
    p.add_argument("--timeout-after", type=int, default=0)
    p.add_argument("--pg-timeout", type=float, default=600.0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--sync-mb", type=float, default=0.0)
    args = p.parse_args()

    ctx = train.setup(timeout_s=args.pg_timeout)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.dim, args.wide), nn.GELU(), nn.Linear(args.wide, args.wide),
                          nn.GELU(), nn.Linear(args.wide, 1))
    optim = torch.optim.SGD(model.parameters(), lr=args.lr)
    n = max(args.batch * ctx.world_size * 8, 256)
    loader = DataLoader(Slow(n, args.dim, args.data_delay, args.batch), batch_size=args.batch,
                        shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(0))
    model, optim, loader = train.prepare(model, optim, loader, loss_fn=F.mse_loss)
    synced = torch.zeros(int(args.sync_mb * 2**20) // 4)  # float32
    batches = iter(())
    for step in range(1, args.steps + 1):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = train.forward_backward(model, x, y)
        if args.sync_mb and ctx.world_size > 1:
            dist.all_reduce(synced)
        if ctx.rank == args.straggle_rank and args.straggle:
            time.sleep(args.straggle)
        optim.step()
        optim.zero_grad(set_to_none=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        train.report(step, loss=loss.item(), samples=args.batch * ctx.world_size,
                     total_steps=args.steps)
        if step == args.stall_after:
            time.sleep(args.stall_s)
            while args.stall_gate is not None and not args.stall_gate.exists():
                time.sleep(0.2)
        if step == args.oom_after and ctx.rank == 1:
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            cap = psutil.Process().memory_info().vms + (1 << 30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
            torch.empty(4 << 30, dtype=torch.uint8)  # past the cap: the allocator fails
        if step == args.timeout_after:
            if ctx.rank == 1:
                time.sleep(args.pg_timeout * 4)
            dist.all_reduce(torch.ones(1))
        if ctx.is_main and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    train.cleanup()


if __name__ == "__main__":
    main()
