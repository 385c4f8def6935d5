"""Save a checkpoint under one layout, resume it under another, and print the losses.

Arguments: a layout as JSON ({"strategy", "dp"?, ...}), the global batch, the checkpoint path,
"save" or "load", and the number of steps. "save" trains from scratch, saves after `--save-at`
steps (2) and keeps going; "load" loads that checkpoint and trains the remaining steps on the
same data. Rank 0 prints `RESULT {"losses": {step: loss}}`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from strategies import dataset, fresh, gpt  # the sibling worker's tiny GPT and data
from torch.utils.data import DataLoader

from gpufleet import train
from gpufleet.parallelism import resolve

SAVE_AT = 2


def main() -> None:
    cfg, global_batch, path, mode, steps = (json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                            sys.argv[4], int(sys.argv[5]))
    ctx = train.setup(verify=False)
    layout = resolve(cfg["strategy"], ctx.world_size, dp=cfg.get("dp"), tp=cfg.get("tp"),
                     pp=cfg.get("pp"), framework=cfg.get("framework", "torchrun"))
    model, optim = fresh()
    loader: Any = DataLoader(dataset(), batch_size=global_batch // layout.dp, shuffle=True,
                             drop_last=True, generator=torch.Generator().manual_seed(0))
    model, optim, loader = train.prepare(model, optim, loader, loss_fn=gpt.loss_fn, layout=layout)
    start = 0
    if mode == "load":
        start = train.load_checkpoint(path, model, optim)
    losses: dict[int, float] = {}
    it = iter(loader)
    for _ in range(start):
        next(it)  # the batches the saved run already trained on
    for step in range(start + 1, steps + 1):
        x, y = next(it)
        loss = train.forward_backward(model, x, y)
        optim.step()
        optim.zero_grad()
        dist.all_reduce(loss)
        losses[step] = loss.item() / ctx.world_size
        if mode == "save" and step == SAVE_AT:
            train.save_checkpoint(path, model, optim, step=step)
    if ctx.is_main:
        print("RESULT " + json.dumps({"losses": losses, "start": start}), flush=True)
    train.cleanup()


if __name__ == "__main__":
    main()
