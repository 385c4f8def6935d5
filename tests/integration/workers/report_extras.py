"""A DDP loop that never calls `train.prepare` and reports extra metrics of its own: a learning
rate schedule and the gradient norm, through `train.report(step, **extra)`. Rank 0 writes what
it reported to --out (JSON), so a test can hold the dashboard to it. --fail-at N: in the job's
first run the last rank exits 1 after step N (the restart counts from step 1 again)."""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpufleet import train

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--out", required=True)
p.add_argument("--fail-at", type=int, default=0)
a = p.parse_args()
first_run = os.environ.get("GPUFLEET_RUN", "1") == "1"

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / (a.steps + 1))
reported = []
for step in range(1, a.steps + 1):
    x = torch.randn(16, 8)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
    lr = opt.param_groups[0]["lr"]
    opt.step()
    sched.step()
    train.report(step, loss=loss.item(), samples=16 * world, total_steps=a.steps, lr=lr,
                 grad_norm=norm)
    reported.append({"step": step, "loss": loss.item(), "lr": lr, "grad_norm": norm})
    if first_run and step == a.fail_at and rank == world - 1:
        print(f"report_extras rank {rank} failing after step {step} as asked", flush=True)
        sys.exit(1)
    time.sleep(a.sleep)
if rank == 0:
    with open(a.out, "w") as f:
        json.dump(reported, f)
dist.destroy_process_group()
