"""A deterministic DDP job for the survive tests: checkpoints, restarts, resizes.

Rank 0 appends every step's loss (averaged over ranks) and world size to --losses, across
restarts, and writes the final weights to --out. --slow-until STEP makes each step sleep (low
utilization) before that step; steps after it run a busy loop (high utilization), for the
autoscaling test; --alone-sleep S adds S seconds to every step while the job runs on one
worker (a shrink that ruins the throughput, for the goodput verdict). --die-at STEP kills rank
--die-rank with SIGKILL there, once (a marker file next to --losses remembers it). --wait-at
STEP --gate FILE parks every rank after that step until FILE exists, so a test can kill
something mid-job however slow the machine is, instead of racing the remaining steps.
--hold-at STEP keeps the job's first run (GPUFLEET_RUN=1) at that step, after its checkpoint,
until it is ended from outside: every 0.3 s an all-reduce and a report of the same step, so a
rank stopped there silences every rank (its peer blocks in the all-reduce), as a hang does
mid-training; later runs go on to the end. --fail-runs N makes rank --die-rank raise in each
of the job's first N runs, at step --die-at + (run - 1) x --every (after that run's newest
checkpoint, so every run gets further), each with its own message.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpufleet import train


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--losses", type=Path, required=True)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--slow-until", type=int, default=0)
    p.add_argument("--busy-s", type=float, default=0.0)
    p.add_argument("--alone-sleep", type=float, default=0.0)
    p.add_argument("--die-at", type=int, default=0)
    p.add_argument("--die-rank", type=int, default=1)
    p.add_argument("--fail-runs", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--wait-at", type=int, default=0)
    p.add_argument("--gate", type=Path, default=None)
    p.add_argument("--hold-at", type=int, default=0)
    p.add_argument("--writers", type=int, default=None)
    args = p.parse_args()

    ctx = train.setup()
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    y = (x @ torch.randn(16, 1)).tanh() + 0.05 * torch.randn(512, 1)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=10, gamma=0.5)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True,
                        drop_last=True, generator=torch.Generator().manual_seed(1))
    model, optim, loader = train.prepare(model, optim, loader, loss_fn=nn.functional.mse_loss)
    # The scheduler steps the optimizer prepare returned (it may be a new one, over shards).
    sched = torch.optim.lr_scheduler.StepLR(getattr(optim, "_inner", optim), step_size=10,
                                            gamma=0.5)
    ckpt = train.Checkpointer(model, optim, loader=loader, scheduler=sched,
                              every_steps=args.every, async_save=args.async_save,
                              writers=args.writers)
    start = ckpt.resume()
    accum = train.grad_accum_steps()
    marker = args.losses.with_suffix(".died")
    busy = torch.randn(256, 256)

    def batches():  # type: ignore[no-untyped-def]
        while True:
            yield from loader

    stream = batches()
    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        total = torch.zeros(())
        for _ in range(accum):
            bx, by = next(stream)
            total += train.forward_backward(model, bx, by, loss_scale=1 / accum)
        optim.step()
        optim.zero_grad(set_to_none=True)
        sched.step()
        loss = total / accum
        if ctx.world_size > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        if step <= args.slow_until:
            time.sleep(args.step_sleep)
        elif args.busy_s:  # matrix products use every thread the worker was given
            end = time.perf_counter() + args.busy_s
            while time.perf_counter() < end:
                torch.mm(busy, busy)
        if ctx.world_size == 1:
            time.sleep(args.alone_sleep)
        if ctx.rank == 0:
            with args.losses.open("a") as f:
                f.write(json.dumps({"step": step, "loss": loss.item(), "world": ctx.world_size,
                                    "accum": accum, "pid": os.getpid()}) + "\n")
        train.report(step, loss=loss.item(), samples=args.batch * ctx.world_size * accum,
                     total_steps=args.steps, step_time_seconds=time.perf_counter() - t0)
        run = int(os.environ.get("GPUFLEET_RUN", "1"))
        if args.fail_runs and step == args.die_at + (run - 1) * args.every and \
                run <= args.fail_runs and ctx.rank == args.die_rank:
            raise RuntimeError(f"planned failure {run} at step {step}")
        if step == args.die_at and ctx.rank == args.die_rank and not marker.exists() \
                and not args.fail_runs:
            marker.write_text(str(step))
            os.kill(os.getpid(), signal.SIGKILL)
        ckpt.step(step)
        while step == args.wait_at and args.gate is not None and not args.gate.exists():
            time.sleep(0.05)
        if step == args.hold_at and os.environ.get("GPUFLEET_RUN", "1") == "1":
            _hold(step, ctx.world_size)
    ckpt.close()
    weights = train.full_state_dict(model)
    if ctx.rank == 0 and args.out is not None:
        torch.save(weights, args.out)
    train.cleanup()


def _hold(step: int, world_size: int) -> None:
    """Beat at `step` until ended from outside (600 s at most: a crashed test's job)."""
    beat = torch.zeros(())
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if world_size > 1:
            dist.all_reduce(beat)
        train.report(step)


if __name__ == "__main__":
    main()
