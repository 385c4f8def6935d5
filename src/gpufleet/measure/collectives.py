"""The collectives sweep: a worker that times all-reduce, all-gather, reduce-scatter and
broadcast over a range of sizes (run under torchrun on a cluster's devices), and the pure
arithmetic that turns its timings into nccl-tests style rows.

Sizes follow nccl-tests: the whole buffer, i.e. the all-gather output and the reduce-scatter
input. Each rank times `iters` back-to-back calls after `warmup`; the slowest rank's mean counts
(a collective ends when its last rank does). Before timing, each op is checked once on values
that make a wrong result visible. `python -m gpufleet.measure.collectives` is the worker;
importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from gpufleet.plan.calibration import OPS, CollectivePoint
from gpufleet.plan.comm import algbw_to_busbw

MARKER = "GPUFLEET_COLLECTIVE "
DEFAULT_SIZES_CPU = tuple(2**p for p in range(10, 27, 2))  # 1 KiB .. 64 MiB
DEFAULT_SIZES_GPU = tuple(2**p for p in range(10, 31, 2))  # 1 KiB .. 1 GiB


@dataclass(frozen=True)
class Row:
    op: str
    bytes: int
    seconds: float
    workers: int

    @property
    def algbw_gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def busbw_gbps(self) -> float:
        return algbw_to_busbw(self.op, self.algbw_gbps, self.workers)

    def point(self) -> CollectivePoint:
        return CollectivePoint(op=self.op, bytes=self.bytes, seconds=self.seconds,
                               algbw_gbps=self.algbw_gbps, busbw_gbps=self.busbw_gbps)


def parse_rows(lines: list[str], workers: int) -> tuple[list[Row], list[str]]:
    """Rows from the worker's MARKER lines (torchrun may prefix them), and any check failures."""
    rows: list[Row] = []
    failures: list[str] = []
    decoder = json.JSONDecoder()
    for line in lines:
        for chunk in line.split(MARKER)[1:]:
            try:
                rec, _ = decoder.raw_decode(chunk)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if "wrong" in rec:
                failures.append(str(rec["wrong"]))
            elif rec.get("op") in OPS:
                try:
                    rows.append(Row(op=rec["op"], bytes=int(rec["bytes"]), seconds=float(rec["seconds"]),
                                    workers=workers))
                except (KeyError, TypeError, ValueError):
                    continue
    return rows, failures


def parse_sizes(text: str) -> tuple[int, ...]:
    """'1K,1M,64M' or 'min:max' (powers of 4 between) into byte counts; ValueError if bad."""
    def one(tok: str) -> int:
        tok = tok.strip().upper().removesuffix("B")
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(tok[-1:], 1)
        value = int(float(tok[:-1] if mult > 1 else tok) * mult)
        if value < 4 or value > 2**34:
            raise ValueError(f"'{tok}' must be 4 bytes to 16 GiB")
        return value

    if ":" in text:
        lo, hi = (one(t) for t in text.split(":", 1))
        if hi < lo:
            raise ValueError("min above max")
        sizes = []
        s = lo
        while s <= hi:
            sizes.append(s)
            s *= 4
        return tuple(sizes)
    sizes = sorted({one(t) for t in text.split(",") if t.strip()})
    if not sizes:
        raise ValueError("no sizes given")
    return tuple(sizes)


# -- the worker ---------------------------------------------------------------------------------
def _emit(record: dict[str, Any]) -> None:
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (MARKER + json.dumps(record) + "\n").encode())


def _worker(argv: list[str] | None = None) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser()
    p.add_argument("--sizes", required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ops", default=",".join(OPS))
    args = p.parse_args(argv)
    backend = os.environ.get("GPUFLEET_BACKEND", "gloo")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timedelta(seconds=120), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, n = dist.get_rank(), dist.get_world_size()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def buffers(op: str, numel: int, fill: float) -> tuple[Any, Any]:
        part = max(1, numel // n)
        if op == "all_gather":
            return torch.full((part,), fill, device=device), torch.empty(part * n, device=device)
        if op == "reduce_scatter":
            return torch.full((part * n,), fill, device=device), torch.empty(part, device=device)
        return torch.full((numel,), fill, device=device), None

    def call(op: str, a: Any, b: Any) -> None:
        if op == "all_reduce":
            dist.all_reduce(a)
        elif op == "all_gather":
            dist.all_gather_into_tensor(b, a)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(b, a)
        else:
            dist.broadcast(a, 0)

    want = {"all_reduce": n * (n + 1) / 2, "reduce_scatter": n * (n + 1) / 2, "broadcast": 1.0}
    for op in args.ops.split(","):
        a, b = buffers(op, 1024, float(rank + 1))
        call(op, a, b)
        result = b if b is not None else a
        if op == "all_gather":
            expect = torch.arange(1, n + 1, device=device, dtype=torch.float32).repeat_interleave(a.numel())
            ok = bool(torch.equal(result, expect))
        else:
            ok = bool((result == want[op]).all())
        if not ok:
            _emit({"wrong": f"rank {rank}: {op} gave a wrong result"})
        for size in (int(s) for s in args.sizes.split(",")):
            a, b = buffers(op, max(1, size // 4), 0.0)  # zeros stay zeros over many sums
            for _ in range(args.warmup):
                call(op, a, b)
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                call(op, a, b)
            sync()
            elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if rank == 0:
                _emit({"op": op, "bytes": a.numel() * 4 * (n if op == "all_gather" else 1),
                       "seconds": float(elapsed.item())})
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker()
