"""A script that registers its own DDP comm hook after `prepare()`, as the scaling finding
advises (PowerSGD, compression): the hook runs, is timed, and training stays correct. Rank 0
prints one JSON line."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gpufleet import train
from gpufleet.train.telemetry import COUNTERS


def main() -> None:
    ctx = train.setup()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optim, _ = train.prepare(model, optim)
    calls = [0]

    def counted(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)  # type: ignore[arg-type]

    model.register_comm_hook(None, counted)
    COUNTERS.take(0)
    g = torch.Generator().manual_seed(ctx.rank)  # different data per rank: gradients must agree
    for _ in range(3):
        x = torch.randn(8, 16, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
    figures = COUNTERS.take(3)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, flat)
    if ctx.is_main:
        print(json.dumps({"hook_calls": calls[0], "comm_seconds": figures.get("comm_seconds"),
                          "comm_bytes": figures.get("comm_bytes"),
                          "replicas_equal": all(torch.equal(gathered[0], t) for t in gathered)}),
              flush=True)
    train.cleanup()


if __name__ == "__main__":
    main()
