"""A DDP loop that never calls `train.prepare` and reports extra metrics of its own: a learning
rate schedule and the gradient norm, through `train.report(step, **extra)`. Rank 0 writes what
it reported to --out (JSON), so a test can hold the dashboard to it."""

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpufleet import train

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--out", required=True)
a = p.parse_args()

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
    time.sleep(a.sleep)
if rank == 0:
    with open(a.out, "w") as f:
        json.dump(reported, f)
dist.destroy_process_group()
