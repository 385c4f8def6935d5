"""An ordinary script that builds a DeviceMesh and knows nothing of gpufleet: `init_device_mesh`
joins the default process group itself (it creates it under torchrun, and uses the one already
there under Ray Train), then DDP over the mesh with a DataLoader and SGD. Each rank prints its
rank, the world size and the mesh shape; at the end rank 0 says whether every rank holds the
same parameters (they do only if the ranks really trained together). Options: --max_steps N,
--sleep S (per step), --gate FILE (after step 1 every rank waits until FILE exists: a test
makes it once it has seen what it waits for)."""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--max_steps", type=int, default=20)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--gate", type=Path, default=None)
a = p.parse_args()

world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
rank = dist.get_rank()
print(f"rank {rank} of {dist.get_world_size()}: mesh {tuple(mesh.shape)}", flush=True)
torch.manual_seed(rank)  # different starting weights: DDP's broadcast must make them agree
x = torch.randn(2048, 8)
y = x.sum(1, keepdim=True)
data = TensorDataset(x, y)
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
model = DDP(torch.nn.Linear(8, 1), device_mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
step = 0
while step < a.max_steps:
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
        if a.sleep:
            time.sleep(a.sleep)
        while step == 1 and a.gate is not None and not a.gate.exists():
            time.sleep(0.1)
        if step >= a.max_steps:
            break
flat = torch.cat([q.detach().flatten() for q in model.parameters()])
low, high = flat.clone(), flat.clone()
dist.all_reduce(low, op=dist.ReduceOp.MIN, group=mesh.get_group("dp"))
dist.all_reduce(high, op=dist.ReduceOp.MAX, group=mesh.get_group("dp"))
if rank == 0:
    same = bool(torch.equal(low, high))
    print(f"parameters {'agree' if same else 'differ'} across {world} ranks", flush=True)
