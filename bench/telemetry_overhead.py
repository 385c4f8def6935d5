"""What telemetry costs training, and how far behind the job the dashboard's data is.

Runs examples/gpt.py under `gpufleet run` alternately with telemetry on (the default: device
sampling, in-worker step/data/communication timing, diagnosis, downsampling) and off
(GPUFLEET_TELEMETRY=0: none of those; progress reports still flow), each in a fresh
$GPUFLEET_HOME, and reports the median steady samples/s of each and their ratio.

Then one more telemetry-on run trains while a real `gpufleet dashboard` serves its home and
this script polls the API ten times a second: the lag is the age of the newest throughput point
the API returns (the worker's report time to the moment the API answered). That run is kept out
of the throughput comparison, since on a 2-core machine the dashboard and the poller take CPU
from the workers. The page polls the API once a second, so what it shows is at most one second
older still.

    .venv/bin/python bench/telemetry_overhead.py [--reps 3] [--steps 150] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "gpt.py"


class LagProbe:
    """Poll the dashboard's series API for a job and record how old its newest point is."""

    def __init__(self, base: str, job: str):
        self.base, self.job = base, job
        self.lags: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=5) as http:
            while not self.stop.wait(0.1):
                try:
                    r = http.get(f"/api/jobs/{self.job}/series",
                                 params={"names": "job_samples_per_second",
                                         "since": time.time() - 30})
                except httpx.HTTPError:
                    continue
                answered = time.time()
                if r.status_code != 200:
                    continue
                points = r.json()["series"].get("job_samples_per_second", {}).get("job", [])
                if points:
                    self.lags.append(answered - points[-1][0])


@dataclass
class Run:
    samples_per_s: float
    supervisor_cpu: float  # the supervisor's CPU seconds per wall second (share of one core)
    lags: list[float]


def run_once(telemetry: bool, workers: int, steps: int, warmup: int, workdir: Path,
             watch: bool = False) -> Run:
    home = workdir / f"home-{time.monotonic_ns()}"
    trace = workdir / f"trace-{time.monotonic_ns()}.jsonl"
    env = dict(os.environ, PYTHONUNBUFFERED="1", GPUFLEET_HOME=str(home),
               GPUFLEET_TELEMETRY="1" if telemetry else "0")
    job = f"bench-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "gpufleet.cli", "run", "--gpu", "cpu", "--count", str(workers),
            "--cpu-slots", str(workers), "-y", "--name", job, str(SCRIPT), "--",
            "--steps", str(steps), "--log-every", "10", "--trace", str(trace),
            "--checkpoint-every", "0"]  # checkpoints are measured in bench/checkpoint.py
    dash = probe = None
    if watch:
        home.mkdir(parents=True, mode=0o700)
        dash = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "dashboard", "--port", "0"],
                                env=env, stderr=subprocess.PIPE, text=True)
        assert dash.stderr is not None
        base = dash.stderr.readline().split(" on ", 1)[1].split()[0]
        probe = LagProbe(base, job)
        probe.thread.start()
    started = time.monotonic()
    cpu = 0.0
    try:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        me = psutil.Process(proc.pid)
        while proc.poll() is None:  # the supervisor's own CPU time (not its children's)
            try:
                t = me.cpu_times()
                cpu = t.user + t.system
            except psutil.Error:
                pass
            time.sleep(0.2)
        wall = time.monotonic() - started
        _, err = proc.communicate(timeout=60)
    finally:
        if probe is not None:
            probe.stop.set()
            probe.thread.join()
        if dash is not None:
            dash.terminate()
            dash.wait(timeout=10)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{err[-2000:]}")
    points = [json.loads(line) for line in trace.read_text().splitlines()]
    base_point = next(p for p in points if p["step"] == warmup)
    last = points[-1]
    samples = sum(p["samples"] for p in points if p["step"] > warmup)
    # lags while training ran steadily (the first seconds wait for the first report)
    return Run(samples / (last["t"] - base_point["t"]), cpu / wall,
               probe.lags[10:] if probe else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lag-only", action="store_true", help="only the dashboard lag run")
    args = ap.parse_args()
    if args.lag_only:
        args.reps = 0
    runs: dict[bool, list[Run]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        for rep in range(args.reps):
            order = [True, False] if rep % 2 == 0 else [False, True]
            for telemetry in order:
                r = run_once(telemetry, args.workers, args.steps, args.warmup, Path(tmp))
                runs[telemetry].append(r)
                print(f"rep {rep + 1}: telemetry {'on ' if telemetry else 'off'} "
                      f"{r.samples_per_s:8.1f} samples/s, supervisor CPU "
                      f"{r.supervisor_cpu:.1%} of a core", flush=True)
        lags = sorted(run_once(True, args.workers, args.steps, args.warmup, Path(tmp),
                               watch=True).lags)
    if not runs[True]:
        _print_lags(lags)
        return
    on = [r.samples_per_s for r in runs[True]]
    off = [r.samples_per_s for r in runs[False]]
    cpu_on = statistics.median(r.supervisor_cpu for r in runs[True])
    cpu_off = statistics.median(r.supervisor_cpu for r in runs[False])
    ratio = statistics.median(on) / statistics.median(off)
    pairs = [a / b for a, b in zip(on, off, strict=True)]
    print()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{args.workers} CPU workers, examples/gpt.py, {args.steps} steps, {args.reps} reps")
    print(f"samples/s telemetry on (median):  {statistics.median(on):.1f}")
    print(f"samples/s telemetry off (median): {statistics.median(off):.1f}")
    print(f"ratio on/off: {ratio:.3f} (overhead {1 - ratio:+.1%}); per pair: "
          + ", ".join(f"{p:.3f}" for p in pairs))
    print(f"supervisor CPU (median): {cpu_on:.1%} of a core with telemetry, {cpu_off:.1%} "
          f"without: telemetry takes {cpu_on - cpu_off:.1%} of one core from "
          f"{os.cpu_count()} cores")
    _print_lags(lags)


def _print_lags(lags: list[float]) -> None:
    if lags:
        p50 = lags[len(lags) // 2]
        p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
        print(f"API data lag over {len(lags)} polls: median {p50:.2f} s, p99 {p99:.2f} s, "
              f"max {lags[-1]:.2f} s (the page adds at most its 0.5 s poll and one request)")


if __name__ == "__main__":
    main()
