"""What the worker bootstrap costs an ordinary script: side by side, the same plain DDP loop
(bench/workers/plain_loop.py, no gpufleet import) under bare torchrun and under `gpufleet run`
with the bootstrap on (its default) and off (`--no-bootstrap`), interleaved run by run so the
machine's noise falls on all three alike. The script times its own steady samples/s.

Then, in this process, the bootstrap's own per-step cost: the global optimizer step hook with its
report (JSON, HMAC signature, a non-blocking UDP send to a local socket) against the same
optimizer steps with no hook, in microseconds per step: the figure to hold against a real
step's time, which the end-to-end ratios on a noisy 2-core machine cannot resolve finely.

    .venv/bin/python bench/bootstrap_overhead.py [--reps 4] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "workers" / "plain_loop.py"
ARMS = ("bare torchrun", "gpufleet, bootstrap on", "gpufleet, --no-bootstrap")


def run_once(arm: str, steps: int) -> float:
    args = ["--max_steps", str(steps)]
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "GPUFLEET_HOME": home, "GPUFLEET_CPU_SLOTS": "2",
               "OMP_NUM_THREADS": "1"}
        if arm == "bare torchrun":
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", str(SCRIPT), *args]
        else:
            extra = ["--no-bootstrap"] if "no-bootstrap" in arm else []
            argv = [sys.executable, "-m", "gpufleet.cli", "run", "--gpu", "cpu", "--count", "2",
                    "--name", "bench", "-y", *extra, str(SCRIPT), "--", *args]
        r = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        m = re.search(r"bench: samples/s ([0-9.]+)", r.stdout + r.stderr)
        if r.returncode != 0 or m is None:
            raise SystemExit(f"{arm}: failed ({r.returncode})\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        return float(m.group(1))


def hook_cost(steps: int = 20000) -> tuple[float, float, float]:
    """µs per optimizer step in process: without the hook; with it as it runs (reports batched
    to at most one per MIN_INTERVAL_S); with it reporting every step (the upper bound)."""
    import torch

    from gpufleet.reportauth import new_key

    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    os.environ.update({"RANK": "0", "WORLD_SIZE": "2", "GPUFLEET_REPORT_KEY": new_key(),
                       "GPUFLEET_REPORT_ADDR": f"127.0.0.1:{sink.getsockname()[1]}"})
    param = torch.nn.Parameter(torch.zeros(4))
    param.grad = torch.zeros(4)
    opt = torch.optim.SGD([param], lr=0.0)

    def timed() -> float:
        started = time.perf_counter()
        for _ in range(steps):
            opt.step()
        return (time.perf_counter() - started) / steps * 1e6

    timed()  # warm up
    without = statistics.median(timed() for _ in range(3))
    from gpufleet.bootstrap import steps as steps_mod
    from gpufleet.bootstrap import worker

    worker._on_optimizer(sys.modules["torch.optim.optimizer"])
    batched = statistics.median(timed() for _ in range(3))
    steps_mod.MIN_INTERVAL_S = 0.0  # report every step: the upper bound of the cost
    every = statistics.median(timed() for _ in range(3))
    sink.close()
    return without, batched, every


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for rep in range(a.reps):  # --reps 0: the in-process figures only
        for arm in ARMS if rep % 2 == 0 else tuple(reversed(ARMS)):
            rates[arm].append(run_once(arm, a.steps))
            print(f"rep {rep + 1} {arm}: {rates[arm][-1]:.1f} samples/s", flush=True)
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    bare = statistics.median(rates["bare torchrun"]) if a.reps else 0.0
    print("| arm | steady samples/s (median) | / bare torchrun | pairs (each rep's ratio) |")
    print("|---|---|---|---|")
    for arm in ARMS if a.reps else ():
        med = statistics.median(rates[arm])
        pairs = ", ".join(f"{r / b:.3f}" for r, b in zip(rates[arm], rates["bare torchrun"],
                                                         strict=True))
        print(f"| {arm} | {med:.1f} | {med / bare:.3f} | {pairs} |")
    without, batched, every = hook_cost()
    print(f"\nper optimizer step, in process: {without:.2f} µs without the hook; "
          f"{batched:.2f} µs with it as it runs (+{batched - without:.2f}); "
          f"{every:.2f} µs reporting every step (+{every - without:.2f})")


if __name__ == "__main__":
    main()
