"""Time from a rank's death to training resumed: `gpufleet run` against bare `torchrun`.

Runs bench/workers/recovery_worker.py (`--ranks` gloo ranks, 2 by default, a small DDP model,
a checkpoint through `gpufleet.train.Checkpointer` every `--every` steps, a wall-clock
timestamp per step) alternately under

- `gpufleet run WORKER --gpu cpu --count 2 -y --max-restarts 1 --no-warm` (a fresh $GPUFLEET_HOME each
  time, GPUFLEET_CPU_SLOTS=2): torchrun inside runs with --max-restarts 0, and gpufleet's
  supervisor restarts the group, from the job's checkpoint folder;
- the same with `--warm`, the default (workers forked from a forkserver with torch imported; a restart is
  handed to the launcher that waits with its workers ended, the same forkserver: docs/warm.md);
- `torchrun --standalone --nproc-per-node RANKS --max-restarts 1 WORKER`: torchrun's agent restarts
  the group itself; the same Checkpointer resumes from $GPUFLEET_CHECKPOINT_DIR (a fresh folder
  each time), so both restart from the same checkpoint and redo the same steps. It runs with
  TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (unless --shared-store): with torch's default, the
  agent's TCPStore is shared with the workers and kept across restarts, so a restarted group
  can read the previous attempt's gloo addresses and fail with "Connection refused" (seen here
  with torch 2.13; pytorch/pytorch#135712). gpufleet is unaffected: each of its restarts is a
  new torchrun.

Once rank 0 has logged step `--kill-after`, this script finds rank 1 by its environment (RANK=1
and a BENCH_RECOVERY_ID it set for this run only) and sends it SIGKILL. Death is the moment of
the kill; resumed is the end of the first step completed after the restart. In between, from the
worker's own log: the new rank-0 process starting, its process group joined
(imports, rendezvous), its checkpoint loaded, its first step done.
For gpufleet the job's events (`gpufleet status NAME --json`) split the first part further:
death -> `worker_failed` (detected, the group ended) -> `running` (restarted; the supervisor
restarts at once after a first failure and backs off only after repeated ones).
The table gives medians over `--reps` runs of each and the ratios to bare torchrun.

    .venv/bin/python bench/recovery.py [--reps 3] [--steps 40] [--every 10] [--kill-after 15]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from procs import end_tree

from gpufleet.launch.warm_rank import rank_in_name

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "bench" / "workers" / "recovery_worker.py"
_SCRUB = ("GPUFLEET_CONTROL_FILE", "GPUFLEET_CHECKPOINT_DIR", "GPUFLEET_CHECKPOINT_TO",
          "GPUFLEET_REPORT_ADDR", "GPUFLEET_JOB", "GPUFLEET_JOB_DIR", "GPUFLEET_HOME", "RANK",
          "GPUFLEET_RUN", "TORCHELASTIC_RESTART_COUNT")
MARKER = "BENCH_RECOVERY_ID"


def find_rank(launcher_pid: int, run_id: str, rank: int) -> psutil.Process | None:
    """The worker process of `rank` in this run: RANK and our marker in its environment. Looks
    under the launcher first, then (a process re-parented away) at every process."""
    try:
        under = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        under = []
    for procs in (under, psutil.process_iter()):
        for p in procs:
            try:
                env = p.environ()
                if env.get(MARKER) != run_id:
                    continue
                if env.get("RANK") == str(rank) and str(WORKER) in " ".join(p.cmdline()):
                    return p
                if rank_in_name(p.name(), "RANK") == str(rank):  # a warm rank (launch/warm_rank)
                    return p
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
    return None


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def run_once(launcher: str, args: argparse.Namespace, workdir: Path, rep: int) -> dict[str, Any]:
    run_id = uuid.uuid4().hex
    tag = f"{launcher}-{rep}"
    log = workdir / f"{tag}.jsonl"
    out = workdir / f"{tag}.out"
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update({MARKER: run_id, "PYTHONUNBUFFERED": "1"})
    script_args = ["--events", str(log), "--steps", str(args.steps), "--every", str(args.every),
                   "--step-sleep", str(args.step_sleep), "--width", str(args.width)]
    name = f"bench-recovery-{rep}-{run_id[:8]}"
    if launcher == "torchrun":
        env["GPUFLEET_CHECKPOINT_DIR"] = str(workdir / f"{tag}-checkpoints")
        if not args.shared_store:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(args.ranks), "--max-restarts", "1", str(WORKER),
                *script_args]
    else:
        env.update(GPUFLEET_HOME=str(workdir / f"{tag}-home"), GPUFLEET_CPU_SLOTS=str(args.ranks))
        argv = [sys.executable, "-m", "gpufleet.cli", "run", str(WORKER), "--gpu", "cpu",
                "--count", str(args.ranks), "-y", "--max-restarts", "1", "--name", name,
                "--warm" if launcher == "warm" else "--no-warm", "--", *script_args]
    t_death: float | None = None
    with out.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + args.timeout
            while t_death is None:
                if proc.poll() is not None:
                    raise SystemExit(f"{launcher} ended ({proc.returncode}) before the kill:\n"
                                     + out.read_text(errors="replace")[-3000:])
                if time.monotonic() > deadline:
                    raise SystemExit(f"{launcher}: no step {args.kill_after} in {args.timeout} s")
                events = read_log(log)
                first_pid = events[0]["pid"] if events else None
                if any(e["event"] == "step" and e["pid"] == first_pid
                       and e["step"] >= args.kill_after for e in events):
                    victim = find_rank(proc.pid, run_id, 1)
                    if victim is None:
                        raise SystemExit(f"{launcher}: rank 1 not found by {MARKER}")
                    t_death = time.time()
                    victim.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.02)
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            end_tree(proc.pid)
            if proc.poll() is None:
                proc.wait()
    if code != 0:
        raise SystemExit(f"{launcher} failed ({code}):\n" + out.read_text(errors="replace")[-3000:])
    return measure(launcher, read_log(log), t_death, None if launcher == "torchrun" else env, name)


def measure(launcher: str, events: list[dict[str, Any]], t_death: float,
            env: dict[str, str] | None, name: str) -> dict[str, Any]:
    first_pid = events[0]["pid"]
    before = [e for e in events if e["pid"] == first_pid]
    after = [e for e in events if e["pid"] != first_pid]
    if not after:
        raise SystemExit(f"{launcher}: no second run in the worker's log")
    start = next(e for e in after if e["event"] == "start")
    joined = next(e for e in after if e["event"] == "joined")
    resumed = next(e for e in after if e["event"] == "resumed")
    first_step = next(e for e in after if e["event"] == "step")
    last_before = max(e["step"] for e in before if e["event"] == "step")
    r: dict[str, Any] = {
        "death_to_resumed_s": first_step["t"] - t_death,
        "death_to_process_s": start["t_start"] - t_death,
        "process_to_loaded_s": resumed["t"] - start["t_start"],
        "process_to_joined_s": joined["t"] - start["t_start"],
        "joined_to_loaded_s": resumed["t"] - joined["t"],
        "loaded_to_step_s": first_step["t"] - resumed["t"],
        "last_step_before": last_before,
        "resumed_from": resumed["step"],
        "steps_redone": last_before - resumed["step"],
        "final_step": max(e["step"] for e in after if e["event"] == "step"),
    }
    if env is not None:
        r.update(job_parts(env, name, t_death, first_step["t"]))
    return r


def job_parts(env: dict[str, str], name: str, t_death: float, t_step: float) -> dict[str, Any]:
    """Detection and restart from the job's events, as `gpufleet status --json` gives them."""
    proc = subprocess.run([sys.executable, "-m", "gpufleet.cli", "status", name, "--json"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return {}
    events = json.loads(proc.stdout).get("events", [])

    def first(kind: str, after: float) -> float | None:
        return next((e["time"] for e in events if e["kind"] == kind and e["time"] >= after), None)

    failed = first("worker_failed", t_death)
    restarting = first("restarting", t_death)
    running = first("running", restarting or t_death)
    if failed is None or running is None:
        return {}
    return {"death_to_failed_s": failed - t_death, "failed_to_running_s": running - failed,
            "running_to_step_s": t_step - running,
            "restarting_reason": next((e["reason"] for e in events
                                       if e["kind"] == "restarting"), "")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="runs of each launcher, alternating")
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks (CPU processes)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    ap.add_argument("--kill-after", type=int, default=15,
                    help="SIGKILL rank 1 once rank 0 has logged this step")
    ap.add_argument("--step-sleep", type=float, default=0.1, help="seconds of 'work' per step")
    ap.add_argument("--width", type=int, default=512, help="width of the model's 4 layers")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run before giving up")
    ap.add_argument("--shared-store", action="store_true",
                    help="leave torchrun's agent-shared TCPStore on (torch's default): its "
                    "restarts then read the previous attempt's keys and can fail to rendezvous")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 rep, 16 steps")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.steps, args.every, args.kill_after = 1, 16, 5, 7
    if not args.every <= args.kill_after < args.steps:
        ap.error("need --every <= --kill-after < --steps (a checkpoint before the kill)")
    sides = ["torchrun", "gpufleet", "warm"]
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-recovery-") as tmp:
        for rep in range(args.reps):
            for launcher in sides[rep % 3:] + sides[:rep % 3]:
                r = run_once(launcher, args, Path(tmp), rep)
                results[launcher].append(r)
                print(f"rep {rep + 1} {launcher:8s} death -> resumed {r['death_to_resumed_s']:.2f} s "
                      f"(new process {r['death_to_process_s']:.2f} s, loaded "
                      f"{r['process_to_loaded_s']:.2f} s, step {r['loaded_to_step_s']:.2f} s); "
                      f"resumed from step {r['resumed_from']} after step {r['last_step_before']}: "
                      f"{r['steps_redone']} step(s) redone",
                      file=sys.stderr, flush=True)

    def med(launcher: str, key: str) -> float:
        vals = [r[key] for r in results[launcher] if key in r]
        return statistics.median(vals) if vals else float("nan")

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; {args.ranks} CPU ranks (gloo, DDP), checkpoint every "
          f"{args.every} steps, rank 1 SIGKILLed after step {args.kill_after}, median of "
          f"{args.reps}")
    print()
    print("| measure | bare torchrun | gpufleet run --no-warm | gpufleet run --warm | "
          "--no-warm / torchrun | --warm / torchrun |")
    print("|---|---|---|---|---|---|")
    rows = [("death -> resumed: first step done after the restart (s)", "death_to_resumed_s"),
            ("  death -> new rank-0 process started (s)", "death_to_process_s"),
            ("  process start -> process group joined: imports, rendezvous (s)",
             "process_to_joined_s"),
            ("  joined -> checkpoint loaded: model, Checkpointer, resume (s)",
             "joined_to_loaded_s"),
            ("  checkpoint loaded -> first step done (s)", "loaded_to_step_s")]
    for label, key in rows:
        t, g, w = (med(side, key) for side in sides)
        print(f"| {label} | {t:.2f} | {g:.2f} | {w:.2f} | {g / t:.2f}x ({g - t:+.2f} s) | "
              f"{w / t:.2f}x ({w - t:+.2f} s) |")
    t, g, w = (med(side, "steps_redone") for side in sides)
    print(f"| steps redone | {t:.0f} | {g:.0f} | {w:.0f} | | |")
    print()
    if any("death_to_failed_s" in r for r in results["gpufleet"]):
        print("gpufleet's part, from its job events (median):")
        print()
        print("| part | gpufleet run (s) | --warm (s) |")
        print("|---|---|---|")
        for label, key in (
                ("death -> worker_failed (torchrun ends the group, the supervisor sees it)",
                 "death_to_failed_s"),
                ("worker_failed -> running (no backoff before a first restart)",
                 "failed_to_running_s"),
                ("running -> first step done (torchrun, rendezvous, imports, load, one step)",
                 "running_to_step_s")):
            print(f"| {label} | {med('gpufleet', key):.2f} | {med('warm', key):.2f} |")
        print()
    print("gpufleet's supervisor restarts at once after a first failure (backing off 1, 2, 4 ... "
          "s only after repeated ones): plain, by starting a fresh torchrun; --warm, by handing "
          "the run to the launcher that waits with its workers ended; bare torchrun's agent "
          "restarts its workers in place, polling them every 0.1 s (--monitor-interval).")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
