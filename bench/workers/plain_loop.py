"""An ordinary DDP training loop (no gpufleet import) that times itself: the bootstrap overhead
benchmark's subject. Prints one line `bench: samples/s X steps N` from rank 0, measured from
step --warmup to the end, so start-up is left out and both arms are timed the same way."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--max_steps", type=int, default=300)
p.add_argument("--warmup", type=int, default=30)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--width", type=int, default=256)
a = p.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
x = torch.randn(a.batch * 64, a.width)
y = torch.randn(a.batch * 64, 1)
data = TensorDataset(x, y)
loader = DataLoader(data, batch_size=a.batch, sampler=DistributedSampler(data))
net = torch.nn.Sequential(torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                          torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                          torch.nn.Linear(a.width, 1))
model = DistributedDataParallel(net)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step, started = 0, 0.0
while step < a.max_steps:
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step == a.warmup:
            started = time.perf_counter()
        if step % 50 == 0 and dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
        if step >= a.max_steps:
            break
elapsed = time.perf_counter() - started
if dist.get_rank() == 0:
    rate = (a.max_steps - a.warmup) * a.batch * dist.get_world_size() / elapsed
    print(f"bench: samples/s {rate:.2f} steps {a.max_steps}", flush=True)
# gloo can abort ("terminate called without an active exception") when one rank tears the
# group down while the other is still in its last all-reduce: meet first
dist.barrier()
dist.destroy_process_group()
