"""Worker for bench/checkpoint.py: one DDP job that saves through `train.Checkpointer` in every
mode (sync/async x simultaneous/staggered writes), interleaved, and times each save.

Run under torchrun (the driver does this); rank 0 writes the results as JSON to --out. Every
mode has its own Checkpointer and folder (`--root/MODE`); the modes take turns, in a rotating
order, so the noise of a shared machine falls on all of them alike. Per save and rank it
records the time training was blocked (the Checkpointer's `blocked_s`) and the time from the
call to `save` until `wait()` returned (the checkpoint complete; nothing trains in between, so
for an async save this is the write's own duration), and, on rank 0, the size of the finished
checkpoint folder.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gpufleet import train

# (name, async_save, writers): writers=None lets every local rank write at once
MODES: list[tuple[str, bool, int | None]] = [
    ("sync-simultaneous", False, None),
    ("sync-staggered", False, 1),
    ("async-simultaneous", True, None),
    ("async-staggered", True, 1),
]


def build_model(state_mb: float, width: int) -> nn.Sequential:
    """Linear layers of `width`, as many as make params + Adam's two moments about `state_mb`
    MB of fp32 (12 bytes per parameter)."""
    per_layer = width * width + width
    layers = max(1, round(state_mb * 1e6 / (12 * per_layer)))
    mods: list[nn.Module] = []
    for i in range(layers):
        mods.append(nn.Linear(width, width))
        if i < layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True, help="one checkpoint folder per mode here")
    p.add_argument("--out", type=Path, required=True, help="results JSON (rank 0)")
    p.add_argument("--state-mb", type=float, default=75.0)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--saves", type=int, default=5, help="timed saves per mode")
    p.add_argument("--warmup-saves", type=int, default=1, help="untimed saves per mode first")
    p.add_argument("--train-steps", type=int, default=3, help="optimizer steps before saving")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--modes", default=",".join(m[0] for m in MODES))
    args = p.parse_args()

    ctx = train.setup()
    torch.manual_seed(0)
    model = build_model(args.state_mb, args.width)
    params = sum(t.numel() for t in model.parameters())
    optim = torch.optim.Adam(model.parameters(), lr=1e-4)
    model, optim, _ = train.prepare(model, optim, loss_fn=nn.functional.mse_loss)
    gen = torch.Generator().manual_seed(1 + ctx.rank)

    def train_step() -> None:
        x = torch.randn(args.batch, args.width, generator=gen)
        train.forward_backward(model, x, x)
        optim.step()
        optim.zero_grad(set_to_none=True)

    for _ in range(args.train_steps):  # Adam's moments exist from the first step on
        train_step()

    wanted = args.modes.split(",")
    modes = [m for m in MODES if m[0] in wanted]
    ckpts = {name: train.Checkpointer(model, optim, dir=args.root / name, every_steps=10**9,
                                      async_save=async_save, writers=writers)
             for name, async_save, writers in modes}
    saves: list[dict[str, Any]] = []
    step = args.train_steps
    total = args.warmup_saves + args.saves
    for rep in range(total):
        order = modes[rep % len(modes):] + modes[:rep % len(modes)]
        for name, _async_save, _writers in order:
            train_step()  # the state changes between saves, as in training
            step += 1
            ckpt = ckpts[name]
            dist.barrier()  # every rank starts the save together
            t0 = time.perf_counter()
            ckpt.save(step)
            blocked = ckpt.blocked_s[-1]
            ckpt.wait()
            complete = time.perf_counter() - t0
            size = folder_bytes(args.root / name / f"step-{step:08d}") if ctx.rank == 0 else 0
            per_rank: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(per_rank, (blocked, complete))
            saves.append({"mode": name, "rep": rep, "warmup": rep < args.warmup_saves,
                          "step": step, "blocked_s": [b for b, _ in per_rank],
                          "complete_s": [c for _, c in per_rank], "bytes": size})
    for ckpt in ckpts.values():
        ckpt.close()
    if ctx.rank == 0:
        args.out.write_text(json.dumps({
            "world_size": ctx.world_size, "params": params, "state_bytes": params * 12,
            "width": args.width, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "pid": os.getpid(), "saves": saves}, indent=1))
    train.cleanup()


if __name__ == "__main__":
    main()
