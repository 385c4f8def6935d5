"""An ordinary DDP script (gloo, DataLoader, SGD; no gpufleet import) that fails in its first
`--fail-runs` runs: rank 1 raises at step 3, each run with its own message (so no two failures
read the same). Every rank prints its run, restart count, pid and parent pid (under a warm
start the parent is the forkserver: the same one across runs means the same launcher); rank 0
prints the final loss, which is the same whenever the script runs to its end.
Usage: restart_probe.py [--fail-runs N] [--steps N] [--fail-always]"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--fail-runs", type=int, default=1)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--fail-always", action="store_true")
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
run = int(os.environ.get("GPUFLEET_RUN", "1"))
print(f"probe run {run} rank {rank} restart_count {os.environ.get('TORCHELASTIC_RESTART_COUNT')}"
      f" pid {os.getpid()} ppid {os.getppid()}", flush=True)
torch.manual_seed(0)
x = torch.randn(512, 8)
y = (x.sum(1, keepdim=True) > 0).float()
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = torch.zeros(())
for step in range(1, a.steps + 1):
    xb, yb = x[step * 16:(step + 1) * 16], y[step * 16:(step + 1) * 16]
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 3 and rank == 1 and (a.fail_always or run <= a.fail_runs):
        raise RuntimeError(f"planned failure {run} at step {step}")
if rank == 0:
    print(f"probe final loss {loss.item():.6f}", flush=True)
dist.destroy_process_group()
sys.exit(0)
