"""A node lost on an SSH pool of 2 test machines: loss -> first step again, with `--spares 1`
against the same job without spares (issue 31).

    .venv/bin/python bench/spares.py [--reps 5] [--setup-s 10]

Machines: the test machines of `scripts/test-machines` ($GPUFLEET_TEST_MACHINES, or 3 started
here and brought down at the end; root only); the pool is the first two of them, so both jobs
have exactly one other machine to go to.

The job: `gpufleet run --pool two --gpu cpu --count 2 --nodes 1 --max-restarts 1
--checkpoint-to DIR [--setup CMD] [--spares 1] examples/gpt.py --steps 100000
--checkpoint-every 5` from a folder only this side has. Once it has a durable checkpoint (and,
with a spare, once the log says the spare is warm: in use a spare warms while the job trains),
the node's machine is killed (`scripts/test-machines kill`: every process SIGKILLed at once).
Measured from the kill to rank 0's first step after the heal (the store's `step` series, the
same clock for both). Without a spare the heal takes the other machine, ships the workdir and
runs the setup there as the run starts; with one, the other machine is the spare, warmed ahead.

Two setups: none (the gain is the shipping of the example's folder), and `sleep S` (`--setup-s`,
a stand-in for an environment's setup of S seconds: a `pip install`, a dataset fetch). Runs
alternate which mode goes first; medians and the ratio are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from machines import (
    HARNESS,
    RUN_TIMEOUT_S,
    add_two,
    first_step_after,
    job_log,
    lab,
    median,
    project,
    with_quiet,
)
from procs import CLI, cli, end_tree


def drill(env: dict[str, str], folder: Path, durable: Path, harness: dict[str, str],
          job: str, spares: int, setup: str) -> float:
    """One job, its node's machine killed; seconds from the kill to the first step after."""
    argv = [*CLI, "run", "--pool", "two", "--gpu", "cpu", "--count", "2", "--nodes", "1",
            "--name", job, "-y", "--max-restarts", "1", "--checkpoint-to", str(durable),
            *(["--spares", str(spares)] if spares else []), *(["--setup", setup] if setup else []),
            "gpt.py", "--", "--steps", "100000", "--checkpoint-every", "5", "--sample-bytes", "0"]
    proc = subprocess.Popen(argv, env=env, cwd=folder, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    mdir = harness["GPUFLEET_TEST_MACHINES"]
    victim = ""
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not any(durable.glob("step-*")) or (spares and "warm in" not in job_log(env, job)):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{job}: no durable checkpoint or warm spare:\n"
                                   f"{job_log(env, job)[-2000:]}")
            time.sleep(0.5)
        plan = json.loads((Path(env["GPUFLEET_HOME"]) / "jobs" / job / "ssh-plan.json")
                          .read_text())
        address = plan["nodes"][0]["address"]
        hosts = [ln.split()[0] for ln in Path(harness["GPUFLEET_TEST_HOSTFILE"]).read_text()
                 .splitlines() if ln.strip() and not ln.startswith("#")]
        victim = f"m{hosts.index(address) + 1}"
        killed = time.time()
        subprocess.run([str(HARNESS), "kill", mdir, victim], check=True, capture_output=True)
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{job}: no heal:\n{job_log(env, job)[-2000:]}")
            status = json.loads(cli(env, "status", job, "--json"))
            resumed = next((e["time"] for e in status.get("events", [])
                            if e.get("kind") == "resumed" and e["time"] > killed), None)
            step = first_step_after(env, job, resumed) if resumed is not None else None
            if step is not None:
                return step - killed
            time.sleep(0.5)
    finally:
        with_quiet(lambda: cli(env, "stop", job, timeout=120))
        if proc.poll() is None:
            end_tree(proc.pid)
        if victim:
            subprocess.run([str(HARNESS), "start", mdir, victim], capture_output=True)
        shutil.rmtree(durable, ignore_errors=True)
        durable.mkdir()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--setup-s", type=float, default=10.0)
    args = p.parse_args()
    tmp, durable, harness, started, env = lab("spares")
    results: dict[tuple[str, int], list[float]] = {}
    setups = [("none", ""), (f"sleep {args.setup_s:g}", f"sleep {args.setup_s:g}")]
    try:
        add_two(env, tmp, harness)
        folder = project(tmp, "project")
        n = 0
        for label, setup in setups:
            for rep in range(args.reps):
                order = [0, 1] if rep % 2 == 0 else [1, 0]
                for spares in order:
                    n += 1
                    took = drill(env, folder, durable, harness, f"j{n}", spares, setup)
                    results.setdefault((label, spares), []).append(took)
                    print(f"setup {label}, rep {rep}, spares {spares}: loss -> first step "
                          f"{took:.1f} s", flush=True)
    finally:
        if started is not None:
            subprocess.run([str(HARNESS), "down", str(started)], capture_output=True)
        shutil.rmtree(durable, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; median of {args.reps}\n")
    print("| setup | no spare: loss -> first step (s) | --spares 1 (s) | spare / none |")
    print("|---|---|---|---|")
    for label, _ in setups:
        none, spare = median(results[(label, 0)]), median(results[(label, 1)])
        print(f"| {label} | {none:.1f} ({min(results[(label, 0)]):.1f}-"
              f"{max(results[(label, 0)]):.1f}) | {spare:.1f} ({min(results[(label, 1)]):.1f}-"
              f"{max(results[(label, 1)]):.1f}) | {spare / none:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
