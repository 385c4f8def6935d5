"""Throughput and model-state memory per rank for every strategy, and `prepare` against hand-written
loops, on the example GPT in one process group.

Run it (it starts torchrun itself, once per world size):

    .venv/bin/python bench/strategies.py [--workers 2] [--steps 20] [--reps 5]

Part 1, strategies: for each layout (ddp, zero1, zero2, zero3/fsdp, tp, pp 1f1b and gpipe, and
the meshes a world size of 4 allows), `--warmup` steps and then `--steps` timed steps; samples/s
is the global batch times steps over the time, and each rank's parameter, gradient and optimizer
bytes come from `gpufleet.train.model_state_bytes`.

Part 2, overhead: the same model trained by a hand-written DDP loop (DistributedDataParallel,
loss.backward, torch's clip_grad_norm_) and a hand-written FSDP2 loop (fully_shard per block),
against `gpufleet.train.prepare` + `forward_backward` + `clip_grad_norm_` on the same model and
data. Runs alternate (hand then gpufleet, then gpufleet then hand, ...) `--reps` times so a
noisy machine hits both;
the ratio is of the medians (gpufleet / hand-written samples/s; 1.0 means no overhead).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SEQ, LAYERS, DIM, HEADS, BATCH = 64, 4, 128, 4, 16


def _gpt() -> Any:
    spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpt_example"] = module
    spec.loader.exec_module(module)
    return module


# --- worker side (under torchrun) ------------------------------------------------------------

def _data(gpt: Any) -> Any:
    import torch

    torch.manual_seed(1)
    return gpt.Windows(torch.randint(0, 256, (SEQ * 4000 + 1,), dtype=torch.uint8), SEQ)


def _timed(step: Any, batches: Any, warmup: int, steps: int) -> float:
    """Seconds for `steps` steps after `warmup`, ranks in step (a barrier at both ends)."""
    import torch.distributed as dist

    for _ in range(warmup):
        step(*next(batches))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(*next(batches))
    dist.barrier()
    return time.perf_counter() - t0


def _endless(loader: Any) -> Any:
    while True:
        yield from loader


def _gpufleet_run(gpt: Any, layout: Any, warmup: int, steps: int) -> tuple[float, dict[str, int]]:
    import torch
    from torch.utils.data import DataLoader

    from gpufleet import train

    torch.manual_seed(0)
    model = gpt.GPT(SEQ, LAYERS, DIM, HEADS)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(_data(gpt), batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    model, optim, loader = train.prepare(model, optim, loader, loss_fn=gpt.loss_fn, layout=layout)

    def step(x: Any, y: Any, keep_grads: bool = False) -> None:
        train.forward_backward(model, x, y)
        train.clip_grad_norm_(model, 1.0)
        optim.step()
        if not keep_grads:
            optim.zero_grad(set_to_none=True)

    seconds = _timed(step, _endless(loader), warmup, steps)
    step(*next(iter(loader)), keep_grads=True)  # one more, gradients kept for the memory reading
    return seconds, train.model_state_bytes(model, optim)


def _hand_run(gpt: Any, kind: str, warmup: int, steps: int) -> float:
    """The loop a user would write without gpufleet: DDP or FSDP2 by hand."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    torch.manual_seed(0)
    model = gpt.GPT(SEQ, LAYERS, DIM, HEADS)
    if kind == "ddp":
        wrapped: Any = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        wrapped = fully_shard(model)
    optim = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    data = _data(gpt)
    sampler = DistributedSampler(data, num_replicas=dist.get_world_size(), rank=dist.get_rank(),
                                 shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)

    def step(x: Any, y: Any) -> None:
        loss = gpt.loss_fn(wrapped(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(wrapped.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)

    return _timed(step, _endless(loader), warmup, steps)


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from gpufleet import train
    from gpufleet.parallelism import resolve

    gpt = _gpt()
    ctx = train.setup(verify=False)
    world = ctx.world_size
    layouts = [("ddp", {}), ("zero1", {}), ("zero2", {}), ("zero3", {}), ("tp", {}),
               ("pp", {"schedule": "1f1b", "microbatches": 4}),
               ("pp", {"schedule": "gpipe", "microbatches": 4})]
    if world == 4:
        layouts += [("fsdp", {"dp": 2, "tp": 2}), ("ddp", {"dp": 2, "pp": 2}),
                    ("ddp", {"dp": 1, "tp": 2, "pp": 2})]
    for strategy, extra in layouts if not args.overhead_only else []:
        layout = resolve(strategy, world, **extra)
        seconds, state = _gpufleet_run(gpt, layout, args.warmup, args.steps)
        states: list[Any] = [None] * world
        dist.all_gather_object(states, state)
        if ctx.is_main:
            rate = BATCH * layout.dp * args.steps / seconds
            print("ROW " + json.dumps({"part": "strategies", "layout": layout.describe,
                                       "samples_per_s": rate, "states": states}), flush=True)
    if world == args.workers:  # part 2 once, on the main world size
        for kind in ("ddp", "fsdp"):
            layout = resolve(kind, world)
            hand, ours = [], []
            samples = BATCH * world * args.steps
            for rep in range(args.reps):
                # Alternate which goes first, so a slow spell on the machine hits both.
                for which in (("hand", "ours") if rep % 2 == 0 else ("ours", "hand")):
                    if which == "hand":
                        hand.append(samples / _hand_run(gpt, kind, args.warmup, args.steps))
                    else:
                        ours.append(samples / _gpufleet_run(gpt, layout, args.warmup, args.steps)[0])
            if ctx.is_main:
                print("ROW " + json.dumps({"part": "overhead", "kind": kind, "hand": hand,
                                           "gpufleet": ours}), flush=True)
    train.cleanup()


# --- driver side -----------------------------------------------------------------------------

def _launch(world: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world)),
           "PYTHONUNBUFFERED": "1"}
    env.pop("GPUFLEET_REPORT_ADDR", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(world), __file__, "--worker", "--workers", str(args.workers), "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--reps", str(args.reps),
           *(["--overhead-only"] if args.overhead_only else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        sys.exit(f"bench worker failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def report(rows: list[dict[str, Any]], args: argparse.Namespace, seconds: float) -> str:
    lines = [f"machine: {platform.node()} ({os.cpu_count()} cores, {platform.machine()}), "
             f"torch on CPU with gloo; model {LAYERS} layers x {DIM} dim x {HEADS} heads, "
             f"seq {SEQ}, {BATCH} sequences per data-parallel rank; {args.steps} timed steps after "
             f"{args.warmup}; {seconds:.0f} s in all", "",
             "| layout | samples/s | params MiB/rank | grads MiB/rank | optimizer MiB/rank |",
             "|---|---|---|---|---|"]
    for r in (r for r in rows if r["part"] == "strategies"):
        def span(key: str, r: dict[str, Any] = r) -> str:
            values = sorted({_mib(s[key]) for s in r["states"]}, key=float)
            return values[0] if len(values) == 1 else f"{values[0]}-{values[-1]}"
        lines.append(f"| {r['layout']} | {r['samples_per_s']:.0f} | {span('params_bytes')} | "
                     f"{span('grads_bytes')} | {span('optimizer_bytes')} |")
    lines += ["", "| loop | hand-written samples/s (median) | gpufleet prepare samples/s (median) "
              "| gpufleet / hand-written |", "|---|---|---|---|"]
    for r in (r for r in rows if r["part"] == "overhead"):
        hand, ours = statistics.median(r["hand"]), statistics.median(r["gpufleet"])
        pairs = sorted(o / h for o, h in zip(r["gpufleet"], r["hand"], strict=True))
        lines.append(f"| {r['kind']} ({args.workers} ranks, {args.reps} alternating pairs) | "
                     f"{hand:.0f} | {ours:.0f} | {ours / hand:.3f} (pairs {pairs[0]:.2f}-{pairs[-1]:.2f}) |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--four", action="store_true", help="also run the 4-rank meshes")
    p.add_argument("--overhead-only", action="store_true", help="part 2 only")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    t0 = time.perf_counter()
    rows = _launch(args.workers, args)
    if args.four:
        rows += _launch(4, args)
    print(report(rows, args, time.perf_counter() - t0))


if __name__ == "__main__":
    main()
