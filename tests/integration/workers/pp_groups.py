"""Pipeline stages keep every optimizer group, empty or not, through a checkpoint round trip.

Group 0 holds only the embeddings (stage 0's), group 1 the rest, and a LambdaLR scales group 1
by half: stage 1 has no parameter of group 0, yet its group indices must match stage 0's.
Argument: a checkpoint folder. Each rank prints `RESULT {"rank", "sizes", "lrs"}`.
"""

from __future__ import annotations

import json
import sys

import torch
from strategies import dataset, gpt
from torch.utils.data import DataLoader

from gpufleet import train
from gpufleet.parallelism import resolve


def main() -> None:
    ctx = train.setup(verify=False)
    torch.manual_seed(0)
    model = gpt.GPT(16, 4, 32, 4)
    emb = [p for n, p in model.named_parameters() if n.startswith(("tok", "pos"))]
    rest = [p for n, p in model.named_parameters() if not n.startswith(("tok", "pos"))]
    optim = torch.optim.AdamW([{"params": emb, "lr": 1e-3}, {"params": rest, "lr": 1e-2}])
    loader = DataLoader(dataset(), batch_size=8, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    model, optim, loader = train.prepare(model, optim, loader, loss_fn=gpt.loss_fn,
                                         layout=resolve("pp", ctx.world_size))
    sizes = [len(g["params"]) for g in optim.param_groups]
    sched = torch.optim.lr_scheduler.LambdaLR(optim, [lambda s: 1.0, lambda s: 0.5])
    x, y = next(iter(loader))
    train.forward_backward(model, x, y)
    optim.step()
    sched.step()
    optim.zero_grad()
    train.save_checkpoint(sys.argv[1], model, optim, step=1)
    step = train.load_checkpoint(sys.argv[1], model, optim)
    print("RESULT " + json.dumps({"rank": ctx.rank, "sizes": sizes, "step": step,
                                  "lrs": [g["lr"] for g in optim.param_groups]}), flush=True)
    train.cleanup()


if __name__ == "__main__":
    main()
