"""An ordinary DDP script that knows nothing of gpufleet: DataLoader with DistributedSampler,
DDP, an optimizer, a printed loss. Options: --max_steps N, --sleep S (per step), --fail-at N
(rank --fail-rank raises RuntimeError at step N), --print-every N, --gate FILE (after step 1
every rank waits until FILE exists: a test makes it once it has seen what it waits for)."""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--max_steps", type=int, default=20)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--gate", type=Path, default=None)
p.add_argument("--fail-at", type=int, default=0)
p.add_argument("--fail-rank", type=int, default=1)
p.add_argument("--print-every", type=int, default=1)
p.add_argument("--noise-lines", type=int, default=0)
a = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
x = torch.randn(4096, 16)
y = (x.sum(1, keepdim=True) > 0).float()
data = TensorDataset(x, y)
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while step < a.max_steps:
    for xb, yb in loader:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if a.fail_at and step == a.fail_at and rank == a.fail_rank:
            for i in range(a.noise_lines):
                print(f"Overriding: noise_{i} = {i}", flush=True)
            raise RuntimeError(f"boom at step {step} on rank {rank}")
        if rank == 0 and step % a.print_every == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
        if a.sleep:
            time.sleep(a.sleep)
        while step == 1 and a.gate is not None and not a.gate.exists():
            time.sleep(0.1)
        if step >= a.max_steps:
            break
dist.destroy_process_group()
sys.exit(0)
