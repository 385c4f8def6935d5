"""The Slurm side of bench/multinode_launch.py (`--engine slurm`): `gpufleet run` on a Slurm
partition against a hand-written sbatch script that runs the same torchrun.

    .venv/bin/python bench/multinode_launch.py --engine slurm [--reps 3] [--steps 5]

Both sides run examples/gpt.py unchanged (`--steps N --checkpoint-every 0 --trace T`) as 2 gloo
workers, one per node, on 2 nodes of a real Slurm 22.05 (`scripts/test-slurm up DIR 2`: a
slurmctld and slurmds n1, n2 on 127.0.0.1, each node `gpu:h100:1`, feature gpufleet-simulated,
so gpufleet runs its workers on CPU), or of the test Slurm $GPUFLEET_TEST_SLURM names.

- gpufleet: `gpufleet pool add slurm` once, then per repetition `gpufleet run --gpu H100 --count
  2 --nodes 2 -y --name benchN examples/gpt.py -- ...` as a subprocess: a cluster made for the
  job, so one new Slurm allocation per run (sbatch, waiting for RUNNING, one `srun --overlap`
  step per node running that node's torchrun under gpufleet's agent, `scancel` at the end).
- sbatch: `sbatch --wait --nodes=2 --ntasks-per-node=1 --gres=gpu:h100:1 --exclusive
  --output=LOG bench-sbatch.sh ARGS`, a script written here: the head node is the first of
  `scontrol show hostnames $SLURM_JOB_NODELIST` (its NodeAddr, 127.0.0.1 here), a free port
  picked there, then `srun --kill-on-bad-exit=1 python -m torch.distributed.run --nnodes 2
  --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint ADDR:PORT --rdzv-id $SLURM_JOB_ID
  --local-addr 127.0.0.1 examples/gpt.py ARGS` with GLOO_SOCKET_IFNAME=lo and the
  OMP_NUM_THREADS and MKL_NUM_THREADS gpufleet gives its workers (read from `gpufleet run
  --dry-run` before the runs, and checked against each run's slurm-plan.json).

Per repetition, from starting the launcher: time to first step (rank 0's clock at the end of
step 1, the `--trace` file's first record), when rank 0's lines "2 ranks joined", "... M params"
and "step 1/" reached the launcher's output (gpufleet: its stdout; sbatch: the --output file,
read every 50 ms while sbatch waits), the wall time to the launcher's exit, and to see where
the time goes: when the Slurm job was submitted, when it ran (gpufleet's "running on" line; the
batch script's first line) and when the srun step(s) started; the mean time of a step after
step 1 (from the trace: are the workers themselves slower?); and the CPU time the run used: the
launcher's own process tree on this host (rusage), and, sampled every 0.5 s, every process that
carries the bench's environment (Slurm's steps get it too) by kind: the workers, the torchrun
agents, gpufleet's processes (CLI and supervisor, Slurm driver, node agents), the Slurm client
commands, the rest. Before each run the bench waits until the previous run's Slurm job has
left squeue and 2 nodes are idle. The two sides alternate which goes first. Medians and the
ratio gpufleet / sbatch are printed as a markdown table.

Everything is under a throwaway $GPUFLEET_HOME; the test Slurm started here is brought down
(`scripts/test-slurm down`) however the run ends (SIGTERM and SIGHUP too). Before that, any job
of the bench still in squeue is cancelled and any process still carrying the bench's
environment is ended by pid, and both are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
from procs import CLI, ROOT, cli, end_tree

GPT = ROOT / "examples" / "gpt.py"
TEST_SLURM = ROOT / "scripts" / "test-slurm"
NODES = 2
RUN_TIMEOUT_S = 600
SETTLE_S = 60.0
TAIL_S = 0.05  # how often the sbatch side's --output file is read
SAMPLE_S = 0.5  # how often the CPU time of the run's processes is sampled
SBATCH_SCRIPT = "bench-sbatch.sh"  # also the hand-written job's name in squeue
GPUFLEET_JOB = re.compile(r"Slurm job (\d+) submitted")
SBATCH_JOB = re.compile(r"Submitted batch job (\d+)")

Mark = Callable[[str], bool]
# Rank 0's own lines: gpufleet tags them `[rank0]:`, bare torchrun prints them as they are.
# gpufleet also prints its own progress line, `[gpufleet] NAME step 1/N ...`: not rank 0's.
COMMON: dict[str, Mark] = {
    "joined": lambda ln: "ranks joined over gloo" in ln,
    "built": lambda ln: "M params," in ln,
    "line": lambda ln: "step 1/" in ln and not ln.startswith("[gpufleet]"),
}
GPUFLEET_MARKS: dict[str, Mark] = {
    **COMMON,
    "submitted": lambda ln: GPUFLEET_JOB.search(ln) is not None,
    "running": lambda ln: "gpufleet: Slurm job" in ln and " running on " in ln,
    "steps": lambda ln: "torchrun starting on" in ln,
    "progress": lambda ln: ln.startswith("[gpufleet]") and " step 1/" in ln,
}
SBATCH_MARKS: dict[str, Mark] = {
    **COMMON,
    "submitted": lambda ln: SBATCH_JOB.search(ln) is not None,
    "running": lambda ln: ln.startswith("bench: batch script started"),
    "steps": lambda ln: ln.startswith("bench: srun starting"),
    "srun_end": lambda ln: ln.startswith("bench: srun ended"),
}

BATCH = """#!/bin/bash
# The hand-written side of bench/slurm_launch.py: torchrun on every node of the allocation.
set -euo pipefail
echo "bench: batch script started on $SLURM_JOB_NODELIST"
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
addr=$(scontrol -o show node "$head" | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')
addr=${{addr:-$head}}
port=$({python} -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS={threads} MKL_NUM_THREADS={mkl} PYTHONUNBUFFERED=1
echo "bench: srun starting, rendezvous at $addr:$port (head $head)"
srun --kill-on-bad-exit=1 {python} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 \\
  --rdzv-backend c10d --rdzv-endpoint "$addr:$port" --rdzv-id "$SLURM_JOB_ID" \\
  --local-addr 127.0.0.1 {script} "$@"
echo "bench: srun ended"
"""


def script_args(steps: int, trace: Path) -> list[str]:
    return ["--steps", str(steps), "--checkpoint-every", "0", "--trace", str(trace)]


def trace_times(trace: Path, t0: float) -> dict[str, float]:
    """From rank 0's trace: the end of step 1 and the mean time of the steps after it."""
    ts = [float(json.loads(ln)["t"]) for ln in trace.read_text().splitlines() if ln.strip()]
    step = (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else float("nan")
    return {"first_step_s": ts[0] - t0, "step_s": step}


def slurm(env: dict[str, str], *argv: str) -> str:
    """A Slurm client command's stdout ('' when it fails: the callers poll)."""
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout if done.returncode == 0 else ""


def queue(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Slurm's queue: job id -> (name, state)."""
    rows = (ln.split("|") for ln in slurm(env, "squeue", "-h", "-o", "%i|%j|%T").splitlines())
    return {r[0]: (r[1], r[2]) for r in rows if len(r) == 3}


def idle_nodes(env: dict[str, str]) -> set[str]:
    rows = (ln.split("|") for ln in slurm(env, "sinfo", "-h", "-N", "-o", "%N|%T").splitlines())
    return {r[0] for r in rows if len(r) == 2 and r[1] == "idle"}


def settle(env: dict[str, str], jobs: set[str]) -> tuple[float, float]:
    """Wait until none of `jobs` is in squeue and NODES nodes are idle: (seconds until the jobs
    had left squeue, seconds until both)."""
    t0 = time.monotonic()
    gone = None
    while True:
        now = time.monotonic() - t0
        if gone is None and not jobs & queue(env).keys():
            gone = now
        if gone is not None and len(idle_nodes(env)) >= NODES:
            return gone, now
        if now > SETTLE_S:
            print(f"warning: after {SETTLE_S:.0f} s, jobs {sorted(jobs & queue(env).keys())} in squeue, "
                  f"idle nodes {sorted(idle_nodes(env))}; going on", file=sys.stderr)
            return gone if gone is not None else now, now
        time.sleep(0.1)


CPU_KINDS = ("workers", "torchrun", "gpufleet", "slurm clients", "other")
SLURM_CLIENTS = {"sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo"}


def cpu_kind(argv: list[str]) -> str:
    """Which part of a run a process is, by its command line."""
    if "torch.distributed.run" in argv:
        return "torchrun"  # the elastic agent of a node
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1].startswith("gpufleet"):
        return "gpufleet"  # the CLI and its supervisor, the Slurm driver, the node agents
    if any(a.endswith("gpt.py") for a in argv):
        return "workers"
    if argv and Path(argv[0]).name in SLURM_CLIENTS:
        return "slurm clients"
    return "other"  # the batch script's shell, its port picker, the allocation's `sleep infinity`


class CpuSampler(threading.Thread):
    """Every SAMPLE_S, the CPU time (user + system) of each live process carrying one of the
    bench's variables (the launcher's tree here and what Slurm runs for it on the nodes); a
    process's last sample counts, so one that lives less than SAMPLE_S may be missed."""

    def __init__(self, marks: tuple[str, ...]):
        super().__init__(daemon=True)
        self.marks = [m.partition("=")[::2] for m in marks]
        self.finish = threading.Event()
        self.cpu: dict[tuple[int, float], tuple[str, float]] = {}
        self.others: set[tuple[int, float]] = set()

    def run(self) -> None:
        while not self.finish.wait(SAMPLE_S):
            self.tick()
        self.tick()

    def tick(self) -> None:
        for p in psutil.process_iter():
            try:
                key = (p.pid, p.create_time())
                if key in self.others or p.pid == os.getpid():
                    continue
                if key not in self.cpu:
                    environ = p.environ()
                    if not any(environ.get(k) == v for k, v in self.marks):
                        self.others.add(key)
                        continue
                    self.cpu[key] = (cpu_kind(p.cmdline()), 0.0)
                t = p.cpu_times()
                self.cpu[key] = (self.cpu[key][0], t.user + t.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue

    def totals(self) -> dict[str, float]:
        out = dict.fromkeys(CPU_KINDS, 0.0)
        for kind, cpu in self.cpu.values():
            out[kind] += cpu
        return out


def stamped(argv: list[str], env: dict[str, str], log: Path, marks: dict[str, Mark],
            tail: Path | None = None, sample: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run a launcher, stamping each line of its stdout (and of `tail`, a file it writes) as it
    arrives: its start, end, and when each mark's line first arrived (seconds after start);
    with `sample` (the bench's variables), the CPU time of the run's processes by kind."""
    start = time.time()
    sampler = CpuSampler(sample)
    seen: dict[str, float] = {}
    lock = threading.Lock()
    done = threading.Event()
    out = log.open("w")

    def note(src: str, line: str) -> None:
        now = time.time()
        with lock:
            out.write(f"{now - start:8.3f} {src} {line}\n")
            for key, hit in marks.items():
                if key not in seen and hit(line):
                    seen[key] = now - start

    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            note("|", line.rstrip("\n"))

    def follow() -> None:
        assert tail is not None
        pos, buf = 0, b""
        while True:
            last = done.is_set()
            try:
                with tail.open("rb") as f:
                    f.seek(pos)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            pos += len(chunk)
            *lines, buf = (buf + chunk).split(b"\n")
            for raw in lines:
                note(">", raw.decode("utf-8", "replace"))
            if last:
                if buf:
                    note(">", buf.decode("utf-8", "replace"))
                return
            time.sleep(TAIL_S)

    readers = [threading.Thread(target=read, daemon=True)]
    if tail is not None:
        readers.append(threading.Thread(target=follow, daemon=True))
    for t in readers:
        t.start()
    if sample:
        sampler.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    except BaseException as exc:  # a timeout, or the bench itself interrupted
        sampler.finish.set()
        end_tree(proc.pid)
        out.close()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise RuntimeError(f"{argv[:4]}... did not finish in {RUN_TIMEOUT_S} s; log: {log}") from None
        raise
    end = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    done.set()
    sampler.finish.set()
    for t in readers:
        t.join(timeout=10)
    if sample:
        sampler.join(timeout=30)
    with lock:
        out.close()
    if code != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {code}:\n" + log.read_text()[-3000:])
    tree = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"start": start, "wall_s": end - start, **{f"{k}_s": seen.get(k) for k in marks},
            "launcher_cpu_s": tree, **{f"cpu {k}": v for k, v in sampler.totals().items()}}


# -- the two sides --------------------------------------------------------------------------------
def gpufleet_once(env: dict[str, str], steps: int, tmp: Path, n: int,
                  sample: tuple[str, ...]) -> dict[str, Any]:
    name, trace, log = f"bench{n}", tmp / f"gpufleet-{n}.jsonl", tmp / f"gpufleet-{n}.log"
    argv = [*CLI, "run", "--gpu", "H100", "--count", "2", "--nodes", str(NODES), "-y", "--name", name,
            str(GPT), "--", *script_args(steps, trace)]
    r = stamped(argv, env, log, GPUFLEET_MARKS, sample=sample)
    at_exit = queue(env)
    jobs = sorted(set(GPUFLEET_JOB.findall(log.read_text())))
    db = sqlite3.connect(Path(env["GPUFLEET_HOME"]) / "state.db")
    try:
        job_id, created, started, first_at, status, job_dir = db.execute(
            "SELECT id, created_at, started_at, first_step_at, status, job_dir FROM jobs WHERE name = ?",
            (name,)).fetchone()
        events = db.execute("SELECT kind, time, reason FROM job_events WHERE job_id = ? ORDER BY time, id",
                            (job_id,)).fetchall()
        c_started, c_stopped = db.execute(
            "SELECT started_at, stopped_at FROM clusters WHERE for_job = ? ORDER BY id DESC",
            (name,)).fetchone()
    finally:
        db.close()
    t0 = r["start"]
    return {**r, **trace_times(trace, t0), "store_first_step_s": first_at - t0,
            "created_s": created - t0, "started_s": (started or t0) - t0, "status": status,
            "cluster_started_s": (c_started or t0) - t0,
            "cluster_stopped_s": c_stopped - t0 if c_stopped else None,
            "events": [(k, t - t0) for k, t, _ in events], "threads": plan_threads(Path(job_dir)),
            "diagnoses": [why for k, _, why in events if k == "diagnosis"],
            "slurm_jobs": jobs, "in_queue_at_exit": {j: at_exit[j][1] for j in jobs if j in at_exit}}


def plan_threads(job_dir: Path) -> str:
    """OMP_NUM_THREADS each node's torchrun got, from the plan gpufleet's Slurm driver ran."""
    plan = job_dir / "slurm-plan.json"
    if not plan.exists():
        return "?"
    nodes = json.loads(plan.read_text())["nodes"]
    return ",".join(sorted({n["env"].get("OMP_NUM_THREADS", "unset") for n in nodes}))


def sbatch_once(env: dict[str, str], steps: int, tmp: Path, n: int,
                sample: tuple[str, ...]) -> dict[str, Any]:
    trace, log, output = tmp / f"sbatch-{n}.jsonl", tmp / f"sbatch-{n}.log", tmp / f"sbatch-{n}.out"
    argv = ["sbatch", "--wait", f"--nodes={NODES}", "--ntasks-per-node=1", "--gres=gpu:h100:1",
            "--exclusive", f"--output={output}", str(tmp / SBATCH_SCRIPT), *script_args(steps, trace)]
    r = stamped(argv, env, log, SBATCH_MARKS, tail=output, sample=sample)
    at_exit = queue(env)
    jobs = sorted(set(SBATCH_JOB.findall(log.read_text())))
    return {**r, **trace_times(trace, r["start"]), "slurm_jobs": jobs,
            "in_queue_at_exit": {j: at_exit[j][1] for j in jobs if j in at_exit}}


def gpufleet_threads(env: dict[str, str], steps: int, tmp: Path) -> tuple[str, str]:
    """The OMP_NUM_THREADS and MKL_NUM_THREADS `gpufleet run` gives its workers on this pool, as
    its --dry-run prints them (the same plan a real run writes to slurm-plan.json)."""
    shown = cli(env, "run", "--gpu", "H100", "--count", "2", "--nodes", str(NODES), "-y", "--name",
                "benchdry", "--dry-run", str(GPT), "--", *script_args(steps, tmp / "dry.jsonl"))
    omp = set(re.findall(r"^OMP_NUM_THREADS=(\S+)$", shown, re.M))
    mkl = set(re.findall(r"^MKL_NUM_THREADS=(\S+)$", shown, re.M))
    if len(omp) != 1:
        raise RuntimeError(f"gpufleet run --dry-run shows OMP_NUM_THREADS {sorted(omp)}:\n{shown}")
    threads = omp.pop()
    return threads, mkl.pop() if len(mkl) == 1 else threads


# -- the test Slurm, and what may be left ---------------------------------------------------------
@contextmanager
def test_slurm() -> Iterator[tuple[Path, str]]:
    """The test Slurm's state folder and how it came: $GPUFLEET_TEST_SLURM's, or one of NODES
    nodes started here and brought down on the way out."""
    given = os.environ.get("GPUFLEET_TEST_SLURM")
    if given:
        yield Path(given), "given by $GPUFLEET_TEST_SLURM"
        return
    state = Path(tempfile.mkdtemp(dir="/tmp", prefix="gfs"))  # its path must fit unix sockets
    try:
        t = time.perf_counter()
        up = subprocess.run([str(TEST_SLURM), "up", str(state), str(NODES)], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
        if up.returncode != 0:
            raise RuntimeError(f"scripts/test-slurm up failed ({up.returncode}):\n{up.stdout}{up.stderr}")
        yield state, f"started here, {NODES} nodes up in {time.perf_counter() - t:.1f} s"
    finally:
        down = subprocess.run([str(TEST_SLURM), "down", str(state)], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
        if down.returncode != 0:
            print(f"scripts/test-slurm down {state} failed ({down.returncode}): {down.stderr}",
                  file=sys.stderr)


def ours(marks: tuple[str, ...]) -> list[psutil.Process]:
    """Live processes, other than this one, carrying one of the bench's variables."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            environ = p.environ()
            if p.status() != psutil.STATUS_ZOMBIE and any(
                    environ.get(k) == v for k, _, v in (m.partition("=") for m in marks)):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def leftovers(env: dict[str, str], tmp: Path, marks: tuple[str, ...]) -> list[str]:
    """After the runs: the bench's Slurm jobs still in squeue (cancelled) and processes still
    carrying its environment (ended by pid), each a line; none is expected."""
    said: list[str] = []
    jobs = {j for f in tmp.glob("*.log") for pat in (GPUFLEET_JOB, SBATCH_JOB)
            for j in pat.findall(f.read_text(errors="replace"))}
    waited = time.monotonic() + 10
    while (left := jobs & queue(env).keys()) and time.monotonic() < waited:
        time.sleep(0.2)
    if left:
        listed = queue(env)
        said.append("still in squeue 10 s after the last run, cancelled here: " + ", ".join(
            f"{j} {listed[j][0]} {listed[j][1]}" for j in sorted(left) if j in listed))
        slurm(env, "scancel", *sorted(left))
    waited = time.monotonic() + 10
    while (procs := ours(marks)) and time.monotonic() < waited:
        time.sleep(0.5)
    if procs:
        names = []
        for p in procs:
            try:
                names.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                continue
        said.append(f"{len(names)} process(es) of the bench still running, ended here by pid: "
                    + "; ".join(names))
        for p in procs:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    return said


def _stop(sig: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {sig}")  # so every `finally` below runs


# -- the comparison -------------------------------------------------------------------------------
def med(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(statistics.median(values)) if values else float("nan")


def run(args: argparse.Namespace) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    results: dict[str, list[dict[str, Any]]] = {"gpufleet": [], "sbatch": []}
    said: list[str] = []
    loads = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-slurm-") as tmpdir, test_slurm() as (state, how):
        tmp = Path(tmpdir)
        home = tmp / "home"
        marks = (f"GPUFLEET_HOME={home}", f"GPUFLEET_BENCH_SLURM={tmp}")
        env = {**os.environ, "GPUFLEET_HOME": str(home), "GPUFLEET_BENCH_SLURM": str(tmp),
               "SLURM_CONF": str(state / "slurm.conf"), "PYTHONUNBUFFERED": "1"}
        version = slurm(env, "sinfo", "--version").strip() or "slurm ?"
        add_s = dry_s = float("nan")
        threads = ("?", "?")
        try:
            t = time.perf_counter()
            cli(env, "pool", "add", "slurm")
            add_s = time.perf_counter() - t
            t = time.perf_counter()
            threads = gpufleet_threads(env, args.steps, tmp)
            dry_s = time.perf_counter() - t
            (tmp / SBATCH_SCRIPT).write_text(BATCH.format(python=sys.executable, script=GPT,
                                                          threads=threads[0], mkl=threads[1]))
            print(f"test Slurm {state} ({how}); `pool add slurm` {add_s:.1f} s; gpufleet gives its "
                  f"workers OMP_NUM_THREADS={threads[0]} MKL_NUM_THREADS={threads[1]}", file=sys.stderr)
            prev: dict[str, Any] = {}
            for rep in range(args.reps):
                order = ["gpufleet", "sbatch"] if rep % 2 == 0 else ["sbatch", "gpufleet"]
                for side in order:
                    # the previous run's job leaves squeue, its nodes come back idle
                    prev["gone_s"], prev["idle_s"] = settle(env, set(prev.get("slurm_jobs", ())))
                    once = gpufleet_once if side == "gpufleet" else sbatch_once
                    r = prev = once(env, args.steps, tmp, rep, marks)
                    loads.append(os.getloadavg())
                    results[side].append(r)
                    print(f"rep {rep + 1} {side:8s} first step {r['first_step_s']:.2f} s, line "
                          f"{r['line_s'] or float('nan'):.2f} s, wall {r['wall_s']:.2f} s (Slurm job "
                          f"{','.join(r['slurm_jobs'])}; in squeue at exit: "
                          f"{r['in_queue_at_exit'] or 'none'})", file=sys.stderr)
            prev["gone_s"], prev["idle_s"] = settle(env, set(prev.get("slurm_jobs", ())))
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)  # the clean-up is bounded; let it finish
            said = leftovers(env, tmp, marks)
            for line in said:
                print(f"leftover: {line}", file=sys.stderr)
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for f in [*tmp.glob("*.log"), *tmp.glob("*.out"), tmp / SBATCH_SCRIPT]:
                    if f.exists():
                        (args.logs / f.name).write_text(f.read_text(errors="replace"))
    report(args, results, version, threads, how, add_s, dry_s, loads, said)


def report(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]], version: str,
           threads: tuple[str, str], how: str, add_s: float, dry_s: float,
           loads: list[tuple[float, float, float]], said: list[str]) -> None:
    g, sb = results["gpufleet"], results["sbatch"]
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "?"
    one = [round(la[0], 2) for la in loads]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, torch {torch}, {version}; test Slurm of {NODES} nodes on "
          f"127.0.0.1 ({how}), each gpu:h100:1 (simulated: CPU workers); examples/gpt.py --steps "
          f"{args.steps}, 2 gloo workers on 2 nodes, OMP_NUM_THREADS={threads[0]} both sides; median "
          f"of {args.reps} alternating repetitions; load average (1 min) {min(one):.2f} to "
          f"{max(one):.2f} over the run\n")
    print("| measure | hand-written sbatch | gpufleet run | gpufleet / sbatch |")
    print("|---|---|---|---|")
    rows = (("Slurm job submitted: sbatch's / gpufleet's line (s)", "submitted_s"),
            ("allocation running: the batch script's first line / gpufleet's 'running on' (s)",
             "running_s"),
            ("srun starting: the script's line / gpufleet's 'torchrun starting on' (s)", "steps_s"),
            ("'2 ranks joined' line in the launcher's output (s)", "joined_s"),
            ("'M params' line (data and model built) (s)", "built_s"),
            ("**time to first step (s)**, rank 0's clock at the end of step 1", "first_step_s"),
            ("rank 0's `step 1/` line in the launcher's output (s)", "line_s"),
            ("wall time to the launcher's exit (s)", "wall_s"),
            ("mean step after step 1 (s), from rank 0's trace", "step_s"),
            ("CPU s of the launcher's own process tree (rusage)", "launcher_cpu_s"),
            *((f"CPU s, sampled: {k}", f"cpu {k}") for k in CPU_KINDS))
    for label, key in rows:
        a, b = med(sb, key), med(g, key)
        ratio = f"{b / a:.2f}x" if a > 0.005 else "-"
        print(f"| {label} | {a:.2f} | {b:.2f} | {ratio} ({b - a:+.2f} s) |")
    print(f"\nBefore the runs: `gpufleet pool add slurm` {add_s:.1f} s; `gpufleet run --dry-run` "
          f"{dry_s:.1f} s (to read the OMP_NUM_THREADS={threads[0]} and MKL_NUM_THREADS={threads[1]} "
          "it gives workers, set the same in the hand-written script).")
    print(f"gpufleet's own `[gpufleet] ... step 1/` progress line (median): {med(g, 'progress_s'):.2f} s; "
          f"the batch script's srun ended at {med(sb, 'srun_end_s'):.2f} s (sbatch --wait exited "
          f"at {med(sb, 'wall_s'):.2f} s).")
    print(f"gpufleet, from the store (median s after the command started): cluster started (Slurm "
          f"job RUNNING) {med(g, 'cluster_started_s'):.2f}, job created {med(g, 'created_s'):.2f}, "
          f"started {med(g, 'started_s'):.2f}, first_step_at {med(g, 'store_first_step_s'):.2f}, "
          f"cluster stopped (scancel) {med(g, 'cluster_stopped_s'):.2f}; job status "
          + "/".join(sorted({r["status"] for r in g})) + ".")
    kinds: dict[str, list[float]] = {}
    for r in g:
        firsts: dict[str, float] = {}
        for k, t in r["events"]:
            firsts.setdefault(k, t)
        for k, t in firsts.items():
            kinds.setdefault(k, []).append(t)
    print("gpufleet job events (first of each kind, median s after the command started): "
          + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in kinds.items()))
    found = sorted({why for r in g for why in r["diagnoses"]})
    if found:
        print("gpufleet's diagnoses during the runs: " + " | ".join(found))
    for side, rows_ in (("gpufleet", g), ("sbatch", sb)):
        at_exit = [r for r in rows_ if r["in_queue_at_exit"]]
        states = sorted({s for r in at_exit for s in r["in_queue_at_exit"].values()})
        print(f"{side}: its Slurm job was still in squeue at the launcher's exit in {len(at_exit)} of "
              f"{len(rows_)} runs{' (' + '/'.join(states) + ')' if states else ''}; gone from squeue "
              f"{med(rows_, 'gone_s'):.2f} s after the exit, 2 nodes idle again after "
              f"{med(rows_, 'idle_s'):.2f} s (median).")
    print("OMP_NUM_THREADS per worker: gpufleet (slurm-plan.json) "
          + "/".join(sorted({r["threads"] for r in g}))
          + f", hand-written sbatch {threads[0]} (set in the script).")
    print("Left after the runs: "
          + ("; ".join(said) if said else "nothing in squeue, no process of the bench."))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
