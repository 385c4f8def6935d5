"""A tiny MLP learning a fixed random "teacher" network, trained with DDP: the smallest example.

The data is synthetic, so nothing is downloaded: inputs are Gaussian and the targets come from a
teacher MLP whose weights depend only on --seed. It finishes in seconds on CPUs, which makes it
the job to try a fleet with. Two flags exist for testing the supervisor: --fail-at-step makes one
rank raise mid-run, and --sleep stretches each step into a long-running job.

Run it:
    gpufleet run examples/mlp.py --gpu cpu --count 2 -y
    torchrun --standalone --nproc-per-node=2 examples/mlp.py
    python examples/mlp.py                     # one process, no process group
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpufleet import train


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=128, help="per-rank batch")
    p.add_argument("--in-dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--fail-at-step", type=int, default=None, metavar="N",
                   help="rank 1 (rank 0 when alone) raises RuntimeError at step N")
    p.add_argument("--sleep", type=float, default=0.0, metavar="S",
                   help="sleep S seconds every step, to make a long-running job")
    return p.parse_args()


def mlp(in_dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                         nn.Tanh(), nn.Linear(hidden, 1))


def main() -> None:
    args = parse_args()
    ctx = train.setup()

    # Teacher and student both come from the seed, so every rank builds identical ones.
    torch.manual_seed(args.seed)
    teacher = mlp(args.in_dim, 32).requires_grad_(False)
    probe = teacher(torch.randn(4096, args.in_dim))
    # Standardised targets put the starting MSE near 1 whatever the teacher's scale is.
    mean, std = probe.mean(), probe.std()
    model = mlp(args.in_dim, args.hidden).to(ctx.device)
    ddp: nn.Module = model
    if ctx.world_size > 1:
        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids)
    optim = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, args.steps, eta_min=args.lr / 10)
    # Each rank draws its own fresh samples; the stream depends only on (seed, rank).
    gen = torch.Generator().manual_seed(args.seed * 100_003 + 1 + ctx.rank)
    failing_rank = 1 if ctx.world_size > 1 else 0
    global_batch = args.batch_size * ctx.world_size

    loss_value = float("nan")
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(args.batch_size, args.in_dim, generator=gen)
        y = (teacher(x) - mean) / std
        x, y = x.to(ctx.device), y.to(ctx.device)
        t1 = time.perf_counter()
        if step == args.fail_at_step and ctx.rank == failing_rank:
            raise RuntimeError(f"deliberate failure at step {step}")
        loss = F.mse_loss(ddp(x), y)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        sched.step()
        if args.sleep > 0:
            time.sleep(args.sleep)

        log_now = step == 1 or step % args.log_every == 0 or step == args.steps
        if log_now and ctx.world_size > 1:
            # Only log steps pay for an extra all-reduce; other steps report the local loss.
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            loss_value = avg.item()
        else:
            loss_value = loss.item()
        t2 = time.perf_counter()
        train.report(step, loss=loss_value, samples=global_batch, total_steps=args.steps,
                     step_time_seconds=t2 - t0, data_wait_seconds=t1 - t0)
        if log_now and ctx.is_main:
            print(f"step {step}/{args.steps} loss {loss_value:.4f} "
                  f"samples/s {global_batch / (t2 - t0):.1f}", flush=True)

    if ctx.is_main:
        print(f"final loss {loss_value:.4f}", flush=True)
    train.cleanup()


if __name__ == "__main__":
    main()
