"""A rank's death on a job of 2 machines: death -> first step again, its launchers restarted in
place (warm workers, the default) against fresh launchers that import torch again
(`--no-warm`), side by side (issue 31, item 1).

    .venv/bin/python bench/node_restarts.py [--reps 5]

Machines: the test machines of `scripts/test-machines` ($GPUFLEET_TEST_MACHINES, or 3 started
here and brought down at the end; root only); the pool is the first two of them.

The job: `gpufleet run --pool two --gpu cpu --count 4 --nodes 2 --max-restarts 1
--checkpoint-to DIR [--no-warm] recovery_worker.py -- --steps 20 --every 5 --die-at 12`
from a folder only this side has (bench/workers/recovery_worker.py: a small DDP model, gloo,
a checkpoint every 5 steps). In its first run the last rank (on the second machine) prints
the time and SIGKILLs itself after step 12; the run restarts from the checkpoint of step 10.
Measured from that death to rank 0's first step after it (the store's `step` series; the
machines share this host's clock). In place, each machine's launcher waits with its workers
ended and forks the next run's from its forkserver, torch already imported
(backends/node_restart.py); with `--no-warm` the driver ends and a new one starts a new
torchrun on each machine, whose workers import torch. Runs alternate which mode goes first;
medians and the ratio are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from machines import HARNESS, RUN_TIMEOUT_S, add_two, first_step_after, lab, median, with_quiet
from procs import CLI, cli

WORKER = Path(__file__).resolve().parent / "workers" / "recovery_worker.py"
DIE_AT = 12


def drill(env: dict[str, str], folder: Path, durable: Path, job: str, warm: bool,
          ) -> dict[str, float]:
    """One job whose last rank dies in its first run: seconds from the death to rank 0's
    first step after, and whether the launchers restarted in place."""
    argv = [*CLI, "run", "--pool", "two", "--gpu", "cpu", "--count", "4", "--nodes", "2",
            "--name", job, "-y", "--max-restarts", "1", "--checkpoint-to", str(durable),
            *([] if warm else ["--no-warm"]), "recovery_worker.py", "--", "--steps", "20",
            "--every", "5", "--die-at", str(DIE_AT), "--step-sleep", "0.2"]
    try:
        done = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
        log = cli(env, "logs", job, timeout=60)  # every rank's lines and the launchers'
        died = re.search(r'\{"event": "died", "t": ([0-9.]+)\}', log)
        if done.returncode != 0 or died is None:
            raise RuntimeError(f"{job}: exit {done.returncode}, death seen: {bool(died)}\n"
                               f"{log[-3000:]}")
        death = float(died.group(1))
        step = first_step_after(env, job, death)
        if step is None:
            raise RuntimeError(f"{job}: no step after the death\n{log[-3000:]}")
        return {"took": step - death,
                "in_place": float("run 2: the workers restart inside the running launcher"
                                  in log)}
    finally:
        with_quiet(lambda: cli(env, "stop", job, timeout=120))
        shutil.rmtree(durable, ignore_errors=True)
        durable.mkdir()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    tmp, durable, harness, started, env = lab("node-restarts")
    results: dict[bool, list[float]] = {True: [], False: []}
    try:
        add_two(env, tmp, harness)
        folder = tmp / "project"
        folder.mkdir()
        shutil.copy(WORKER, folder / WORKER.name)
        n = 0
        for rep in range(args.reps):
            for warm in ([True, False] if rep % 2 == 0 else [False, True]):
                n += 1
                got = drill(env, folder, durable, f"j{n}", warm)
                if bool(got["in_place"]) != warm:
                    raise RuntimeError(f"j{n}: in place {bool(got['in_place'])}, warm {warm}")
                results[warm].append(got["took"])
                print(f"rep {rep}, {'in place' if warm else '--no-warm'}: death -> first step "
                      f"{got['took']:.2f} s", flush=True)
    finally:
        if started is not None:
            subprocess.run([str(HARNESS), "down", str(started)], capture_output=True)
        shutil.rmtree(durable, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    inp, cold = median(results[True]), median(results[False])
    print(f"\n{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; median of {args.reps}\n")
    print("| 2 machines x 2 ranks | death -> first step (s) | / --no-warm |")
    print("|---|---|---|")
    print(f"| in place (warm, default) | {inp:.2f} ({min(results[True]):.2f}-"
          f"{max(results[True]):.2f}) | {inp / cold:.2f}x |")
    print(f"| --no-warm (new launchers) | {cold:.2f} ({min(results[False]):.2f}-"
          f"{max(results[False]):.2f}) | 1.00x |")
    print(json.dumps({"in_place": results[True], "no_warm": results[False]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
