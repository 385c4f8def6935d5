"""A tiny job whose durable checkpoint copies fail for a while, for test_durable_copy.py.

Saves every step and waits for the copy, so each step's copy is done before the next. Before
the copy of a step in --blocked, rank 0 blocks the durable folder (--block fill: fills its
small filesystem with a filler file, so the copy runs out of space part-way; --block chmod:
makes the folder read-only, for a test that is not root); before any other step it unblocks it.
With --locked DIR, after the last step rank 0 writes into DIR (which the test made unwritable)
while rank 1 waits in a barrier: the PermissionError that ends the job, and rank 1's echo.
"""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from gpufleet import train

FILLER = "filler.bin"


def block(root: Path, how: str) -> None:
    if how == "chmod":
        root.chmod(0o500)
        return
    with open(root / FILLER, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        f.truncate(max(0, f.tell() - (16 << 10)))  # room for a small file, not the data


def unblock(root: Path, how: str) -> None:
    if how == "chmod":
        root.chmod(0o700)
    else:
        (root / FILLER).unlink(missing_ok=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--durable", type=Path, required=True)
    p.add_argument("--blocked", default="")
    p.add_argument("--block", choices=["fill", "chmod"], default="fill")
    p.add_argument("--locked", type=Path, default=None)
    args = p.parse_args()
    blocked = {int(s) for s in args.blocked.split(",") if s}

    ctx = train.setup()
    torch.manual_seed(0)
    model = nn.Linear(96, 96)  # 37 KiB of weights: more than the 16 KiB left free
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    # keep=1: a copy then needs room for one checkpoint besides the one kept (see ckpt_copy)
    ckpt = train.Checkpointer(model, optim, every_steps=1, keep=1)
    is_blocked = False
    for step in range(ckpt.resume() + 1, args.steps + 1):
        loss = model(torch.randn(4, 96)).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        if ctx.rank == 0 and (step in blocked) != is_blocked:
            (block if step in blocked else unblock)(args.durable, args.block)
            is_blocked = step in blocked
        ckpt.step(step)
        ckpt.wait()  # this step's copy is done (or failed) before the folder changes again
        train.report(step, loss=loss.item(), total_steps=args.steps)
    ckpt.close()
    if args.locked is not None:
        if ctx.rank == 0:
            (args.locked / "done").write_text("x")  # PermissionError: the test locked it
        dist.barrier()
    train.cleanup()


if __name__ == "__main__":
    main()
