"""An ordinary Accelerate training script that knows nothing of gpufleet: Accelerator(), the
model, optimizer and DataLoader through accelerator.prepare, accelerator.backward, a printed loss.

Every rank prints what shows whether it really ran distributed: the process count Accelerate
sees, how many batches its shard of the data holds, a sum all-reduced over the ranks (the ranks
1..n summed) and a checksum of the trained weights (the same on every rank only if the gradients
were averaged: each rank sees different data). Option: --steps N.
"""

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
opts = parser.parse_args()

accelerator = Accelerator()
rank = accelerator.process_index
torch.manual_seed(1234)  # the same initial weights everywhere; the data is split by prepare
inputs = torch.randn(512, 8)
targets = inputs @ torch.linspace(-1.0, 1.0, 8).unsqueeze(1) + 0.1 * torch.randn(512, 1)
loader = DataLoader(TensorDataset(inputs, targets), batch_size=16, shuffle=True)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
print(f"rank {rank}: num_processes {accelerator.num_processes} batches {len(loader)}", flush=True)

done = 0
while done < opts.steps:
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(net(xb), yb)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        done += 1
        if accelerator.is_main_process:
            print(f"step {done}: loss {loss.item():.4f}", flush=True)
        if done >= opts.steps:
            break

ranks_sum = accelerator.reduce(torch.tensor([float(rank + 1)]), reduction="sum")
weights = sum(p.detach().double().sum().item() for p in net.parameters())
print(f"rank {rank}: reduced {ranks_sum.item():.1f} checksum {weights:.10f}", flush=True)
accelerator.end_training()
