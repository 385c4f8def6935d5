"""An ordinary script that shards its own model with DTensor APIs and knows nothing of gpufleet:
`--layout fsdp2` (fully_shard over a 1-D mesh), `tp` (parallelize_module, column- then row-wise)
or `fsdp2+tp` (a 2 x 1 mesh: tensor parallel inside, FSDP2 across; runs on 2 ranks as dp=2,
tp=1). Options: --max_steps N, --layout."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

p = argparse.ArgumentParser()
p.add_argument("--max_steps", type=int, default=5)
p.add_argument("--layout", choices=["fsdp2", "tp", "fsdp2+tp"], default="fsdp2")
a = p.parse_args()

dist.init_process_group("gloo")
world = int(os.environ["WORLD_SIZE"])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
if a.layout == "fsdp2":
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
elif a.layout == "tp":
    parallelize_module(model, init_device_mesh("cpu", (world,)),
                       {"0": ColwiseParallel(), "2": RowwiseParallel()})
else:
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, a.max_steps + 1):
    x = torch.randn(8, 16)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
