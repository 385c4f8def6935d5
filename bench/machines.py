"""Jobs on machines that share nothing (issue 29): what shipping the code and reaching other
machines over ssh costs, side by side with the same job on a loopback pool.

    .venv/bin/python bench/machines.py [--reps 3] [--steps 30]

Machines: the test machines of `scripts/test-machines` ($GPUFLEET_TEST_MACHINES, or 3 started
here and brought down at the end; root only). Each is a network and mount namespace with its
own sshd and node environment, on a link-local bridge; the project folder lives only under
this side's /tmp, which the machines cannot see.

1. Time to first step of the same job, `gpufleet run --gpu cpu --count 4 --nodes 2
   examples/gpt.py --steps N --checkpoint-every 0` from a folder only here, on
   - `ssh`: an SSH pool of the test machines (`pool add ssh --hostfile`): the workdir is
     shipped, the node checked, one torchrun per machine over ssh;
   - `loopback`: a 2-node Ray pool on this machine's loopback (`pool up --local --gpu cpu`),
     whose nodes see this folder (nothing shipped),
   alternating which goes first. Time to first step: from starting the CLI to rank 0's first
   step as the store recorded it (`jobs.first_step_at`), the same clock for both.
2. Bytes shipped (the job log's `workdir ...: N bytes shipped to NODE` lines) for the example's
   folder and for the same folder with a 50 MB file of random bytes, each run twice with
   `--keep-workdir`: the second run of an unchanged folder ships nothing.
3. A machine killed mid-job (`scripts/test-machines kill`) on the SSH pool, `--max-restarts 1
   --checkpoint-to` a folder every machine sees: kill -> the run failed (the `worker_failed`
   event's time) and kill -> rank 0's first step after the heal (the recorded `step` series).

Everything runs under a throwaway $GPUFLEET_HOME and $HOME; the Ray pool is brought down, the
killed machine started again, and machines started here are brought down, however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from procs import CLI, ROOT, cli, end_tree, stop_pool

GPT = ROOT / "examples" / "gpt.py"
HARNESS = ROOT / "scripts" / "test-machines"
RUN_TIMEOUT_S = 900
SHIPPED = re.compile(r"workdir \w+: (\d+) bytes shipped to (\S+)")


def machines_env(tmp: Path) -> tuple[dict[str, str], Path | None]:
    """The harness's variables: the caller's, or 3 machines started here (their DIR)."""
    if os.environ.get("GPUFLEET_TEST_HOSTFILE"):
        return {k: v for k, v in os.environ.items() if k.startswith("GPUFLEET_TEST_")}, None
    mdir = Path(tempfile.mkdtemp(prefix="gfmb.", dir="/tmp"))
    out = subprocess.run([str(HARNESS), "up", "3", str(mdir)], capture_output=True, text=True,
                         check=True).stdout
    found = dict(re.findall(r"(GPUFLEET_TEST_\w+)=(\S+)", out))
    return found, mdir


def project(tmp: Path, name: str, big_bytes: int = 0) -> Path:
    """A folder only this side has: the example, and optionally a file of random bytes."""
    folder = tmp / name
    folder.mkdir()
    shutil.copy(GPT, folder / "gpt.py")
    if big_bytes:
        (folder / "data.bin").write_bytes(os.urandom(big_bytes))
    return folder


def store_row(env: dict[str, str], job: str) -> tuple[float | None, str]:
    db = sqlite3.connect(f"file:{Path(env['GPUFLEET_HOME']) / 'state.db'}?mode=ro", uri=True)
    try:
        first, status = db.execute("SELECT first_step_at, status FROM jobs WHERE name = ?",
                                   (job,)).fetchone()
    finally:
        db.close()
    return first, status


def job_log(env: dict[str, str], job: str) -> str:
    path = Path(env["GPUFLEET_HOME"]) / "jobs" / job / "logs" / "agent.log"
    return path.read_text(errors="replace") if path.exists() else ""


def run_once(env: dict[str, str], pool: str, job: str, folder: Path, steps: int,
             extra: tuple[str, ...] = ()) -> dict[str, Any]:
    argv = [*CLI, "run", "--pool", pool, "--gpu", "cpu", "--count", "4", "--nodes", "2",
            "--name", job, "-y", *extra, "gpt.py", "--", "--steps", str(steps),
            "--checkpoint-every", "0", "--sample-bytes", "0"]
    t0 = time.time()
    done = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    wall = time.time() - t0
    first, status = store_row(env, job)
    if done.returncode != 0 or first is None:
        raise RuntimeError(f"{pool} run {job} failed ({done.returncode}, {status}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    shipped = [int(n) for n, _ in SHIPPED.findall(job_log(env, job))]
    return {"first_step_s": first - t0, "wall_s": wall, "shipped": shipped}


def heal_once(env: dict[str, str], folder: Path, durable: Path,
              harness: dict[str, str]) -> dict[str, float]:
    """A long job; once it has a durable checkpoint, worker1's machine is killed."""
    job = "healme"
    argv = [*CLI, "run", "--pool", "lab", "--gpu", "cpu", "--count", "4", "--nodes", "2",
            "--name", job, "-y", "--max-restarts", "1", "--checkpoint-to", str(durable),
            "gpt.py", "--", "--steps", "100000", "--checkpoint-every", "5",
            "--sample-bytes", "0"]
    proc = subprocess.Popen(argv, env=env, cwd=folder, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    mdir = harness["GPUFLEET_TEST_MACHINES"]
    victim = ""
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not any(durable.glob("step-*")):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the job made no durable checkpoint")
            time.sleep(0.5)
        plan = json.loads((Path(env["GPUFLEET_HOME"]) / "jobs" / job / "ssh-plan.json")
                          .read_text())
        address = next(n["address"] for n in plan["nodes"] if n["name"] == "worker1")
        hosts = [ln.split()[0] for ln in Path(harness["GPUFLEET_TEST_HOSTFILE"]).read_text()
                 .splitlines() if ln.strip() and not ln.startswith("#")]
        victim = f"m{hosts.index(address) + 1}"
        killed = time.time()
        subprocess.run([str(HARNESS), "kill", mdir, victim], check=True, capture_output=True)
        failed = resumed_step = None
        while failed is None or resumed_step is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no heal")
            status = json.loads(cli(env, "status", job, "--json"))
            failed = next((e["time"] for e in status.get("events", [])
                           if e.get("kind") == "worker_failed" and e["time"] > killed), None)
            resumed = next((e["time"] for e in status.get("events", [])
                            if e.get("kind") == "resumed" and e["time"] > killed), None)
            if resumed is not None:
                resumed_step = first_step_after(env, job, resumed)
            time.sleep(0.5)
        return {"kill_to_failed_s": failed - killed, "kill_to_first_step_s": resumed_step - killed}
    finally:
        with_quiet(lambda: cli(env, "stop", job, timeout=120))
        if proc.poll() is None:
            end_tree(proc.pid)
        if victim:
            subprocess.run([str(HARNESS), "start", mdir, victim], capture_output=True)


def first_step_after(env: dict[str, str], job: str, after: float) -> float | None:
    db = sqlite3.connect(f"file:{Path(env['GPUFLEET_HOME']) / 'state.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT min(time) FROM metrics WHERE job = ? AND name = 'step' AND "
                         "rank = 0 AND time > ?", (job, after)).fetchone()
    finally:
        db.close()
    return None if row is None or row[0] is None else float(row[0])


def with_quiet(fn: Any) -> None:
    try:
        fn()
    except Exception as exc:  # clean-up: say it, go on
        print(f"clean-up: {str(exc).splitlines()[0]}", file=sys.stderr)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def lab(name: str) -> tuple[Path, Path, dict[str, str], Path | None, dict[str, str]]:
    """A benchmark's folders and the test machines: its temp folder, a durable folder every
    machine sees (under /run), the harness's variables, the machines' DIR when started here,
    and the CLI's environment (a throwaway $GPUFLEET_HOME and $HOME)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"gfbench-{name}."))
    durable = Path(tempfile.mkdtemp(prefix="gfbench-ck.", dir="/run"))  # all machines see /run
    harness, started = machines_env(tmp)
    env = {**os.environ, "GPUFLEET_HOME": str(tmp / "home"), "HOME": str(tmp / "user"),
           "PYTHONPATH": str(ROOT / "src"), **harness}
    (tmp / "user").mkdir()
    return tmp, durable, harness, started, env


def add_two(env: dict[str, str], tmp: Path, harness: dict[str, str]) -> None:
    """The SSH pool `two`: the first two test machines of the harness's hostfile."""
    lines = [ln for ln in Path(harness["GPUFLEET_TEST_HOSTFILE"]).read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    two = tmp / "hostfile-two"
    two.write_text("\n".join(lines[:2]) + "\n")
    cli(env, "pool", "add", "ssh", "--name", "two", "--hostfile", str(two), "--no-default",
        timeout=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    tmp, durable, harness, started, env = lab("machines")
    ray_up = False
    try:
        cli(env, "pool", "add", "ssh", "--name", "lab", "--hostfile",
            harness["GPUFLEET_TEST_HOSTFILE"], "--no-default", timeout=120)
        cli(env, "pool", "up", "--local", "--nodes", "2", "--gpu", "cpu", "--gpus-per-node",
            "2", "--network", "ethernet", "--name", "loop", "--no-default", timeout=300)
        ray_up = True
        folder = project(tmp, "project")
        results: dict[str, list[dict[str, Any]]] = {"ssh": [], "loopback": []}
        for rep in range(args.reps):
            order = [("ssh", "lab"), ("loopback", "loop")]
            for side, pool in order if rep % 2 == 0 else order[::-1]:
                r = run_once(env, pool, f"{side}{rep}", folder, args.steps)
                results[side].append(r)
                print(f"rep {rep} {side}: first step {r['first_step_s']:.2f} s, wall "
                      f"{r['wall_s']:.1f} s, shipped {r['shipped']}", flush=True)
        ships = {}
        for label, big in (("example", 0), ("example + 50 MB", 50 * 2**20)):
            f = project(tmp, f"ship{big}", big)
            first = run_once(env, "lab", f"first{big}", f, 5, ("--keep-workdir",))
            again = run_once(env, "lab", f"again{big}", f, 5)
            ships[label] = (first, again)
            print(f"{label}: first run shipped {first['shipped']} (first step "
                  f"{first['first_step_s']:.2f} s), unchanged {again['shipped']} (first step "
                  f"{again['first_step_s']:.2f} s)", flush=True)
        heal = heal_once(env, project(tmp, "heal"), durable, harness)
        print(f"kill -> failed {heal['kill_to_failed_s']:.1f} s, kill -> first step after the "
              f"heal {heal['kill_to_first_step_s']:.1f} s", flush=True)
    finally:
        if ray_up:
            stop_pool(env, "loop")
        if started is not None:
            subprocess.run([str(HARNESS), "down", str(started)], capture_output=True)
        shutil.rmtree(durable, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)

    ssh_first = median([r["first_step_s"] for r in results["ssh"]])
    loop_first = median([r["first_step_s"] for r in results["loopback"]])
    print(f"\n{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; median of {args.reps}\n")
    print("| measure | loopback Ray pool | SSH pool, 2 test machines | ssh / loopback |")
    print("|---|---|---|---|")
    print(f"| time to first step (s) | {loop_first:.2f} | {ssh_first:.2f} | "
          f"{ssh_first / loop_first:.2f}x |")
    ssh_wall = median([r["wall_s"] for r in results["ssh"]])
    loop_wall = median([r["wall_s"] for r in results["loopback"]])
    print(f"| wall time (s) | {loop_wall:.1f} | {ssh_wall:.1f} | {ssh_wall / loop_wall:.2f}x |")
    print("\n| workdir | bytes shipped per node, first run | first step (s) | "
          "unchanged, second run | first step (s) |")
    print("|---|---|---|---|---|")
    for label, (first, again) in ships.items():
        print(f"| {label} | {', '.join(map(str, first['shipped']))} | "
              f"{first['first_step_s']:.2f} | {', '.join(map(str, again['shipped']))} | "
              f"{again['first_step_s']:.2f} |")
    print(f"\nkill of a machine -> run failed: {heal['kill_to_failed_s']:.1f} s; -> first step "
          f"after the heal: {heal['kill_to_first_step_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
