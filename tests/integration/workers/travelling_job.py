"""A small DDP job for pools whose nodes share nothing with the submitter.

Each rank prints where its script runs and what it read from `data.txt` beside it (the file
exists only in the submitter's folder, so reading it proves the folder travelled), with which
Python and which gpufleet, and the step
it resumes at; then it trains a tiny model, checkpointing every 2 steps and napping `--nap` s a
step, so a test can act mid-job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import gpufleet
from gpufleet import train


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--nap", type=float, default=0.25)
    args = p.parse_args()
    ctx = train.setup()
    here = Path(__file__).resolve().parent
    node = os.environ.get("SLURMD_NODENAME") or os.environ.get("GPUFLEET_NODE_ID", "?")
    print(f"rank {ctx.rank} on {node} runs {here} and read "
          f"{(here / 'data.txt').read_text().strip()} with {sys.executable} and "
          f"{Path(gpufleet.__file__).parent}", flush=True)
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = train.Checkpointer(model, optim, every_steps=2, keep=2)
    start = ckpt.resume() + 1
    print(f"rank {ctx.rank} on {node} resumes at step {start}", flush=True)
    for step in range(start, args.steps + 1):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        ckpt.step(step)
        train.report(step, loss=loss.item(), total_steps=args.steps)
        time.sleep(args.nap)
    ckpt.close()
    train.cleanup()


if __name__ == "__main__":
    main()
