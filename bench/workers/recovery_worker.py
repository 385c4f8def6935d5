"""Worker for bench/recovery.py: a deterministic DDP job that checkpoints through
`train.Checkpointer` every --every steps and resumes from the newest checkpoint on a restart,
under gpufleet or bare torchrun alike.

Rank 0 appends one JSON line per event to --events, each with a wall-clock time `t` (time.time())
and its pid (a new pid is a new run): `start` (the process began, before importing torch),
`joined` (the process group is up), `resumed` (the checkpoint is loaded; `step` is where it
resumes from, 0 on a fresh run) and `step` (a step completed).

`--die-at STEP` (bench/node_restarts.py, whose ranks run on machines it cannot reach): in the
job's first run the last rank prints `{"event": "died", "t": ...}` after step STEP and SIGKILLs
itself.
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from gpufleet import train  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=Path, default=None)
    p.add_argument("--die-at", type=int, default=0)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--step-sleep", type=float, default=0.1, help="seconds of 'work' per step")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()

    def log(event: str, **fields: Any) -> None:
        if args.events is None:
            return
        with args.events.open("a") as f:
            f.write(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(),
                                "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
                                "gpufleet_run": os.environ.get("GPUFLEET_RUN"), **fields}) + "\n")

    ctx = train.setup()
    if ctx.rank == 0:
        log("start", t_start=T_START)
        log("joined")
    torch.manual_seed(0)
    w = args.width
    x = torch.randn(1024, w)
    y = torch.randn(1024, w)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(w, w), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(1))
    model, optim, loader = train.prepare(model, optim, loader, loss_fn=nn.functional.mse_loss)
    assert loader is not None
    ckpt = train.Checkpointer(model, optim, loader=loader, every_steps=args.every)
    start = ckpt.resume()
    if ctx.rank == 0:
        log("resumed", step=start)

    def batches() -> Iterator[Any]:
        while True:
            yield from loader

    stream = batches()
    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        bx, by = next(stream)
        loss = train.forward_backward(model, bx, by)
        optim.step()
        optim.zero_grad(set_to_none=True)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        time.sleep(args.step_sleep)
        if ctx.rank == 0:
            log("step", step=step, loss=loss.item())
        train.report(step, loss=loss.item(), samples=args.batch * ctx.world_size,
                     total_steps=args.steps, step_time_seconds=time.perf_counter() - t0)
        ckpt.step(step)
        if step == args.die_at and ctx.rank == ctx.world_size - 1 and \
                os.environ.get("GPUFLEET_RUN", "1") == "1":
            print(json.dumps({"event": "died", "t": time.time()}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    ckpt.close()
    train.cleanup()


if __name__ == "__main__":
    main()
