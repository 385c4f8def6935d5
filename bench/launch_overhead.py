"""gpufleet's overhead against bare torchrun, on the same script, in one run.

Runs examples/gpt.py in turn under `torchrun --standalone --nproc-per-node=N`, under
`gpufleet run --gpu cpu --count N --no-warm` (workers started as fresh processes) and under the
same with `--warm`, the default (workers forked from a process that has torch imported;
launch/warm.py), a fresh $GPUFLEET_HOME each time, with the script writing a timestamp per
step on rank 0 (`--trace`).
From those it reports, per launcher, the median over repetitions of:

- time to first step: from starting the command to the end of step 1 (process start-up,
  imports, rendezvous, model build and the first step);
- steady samples/s: samples between the end of step `--warmup` and the last step, over the
  time between them;

and the ratios to bare torchrun. Rotating the order in each repetition spreads the noise of a
shared machine over the launchers.

    .venv/bin/python bench/launch_overhead.py [--reps 3] [--steps 60] [--workers 2]
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "gpt.py"


def run_once(launcher: str, workers: int, steps: int, warmup: int, workdir: Path) -> dict[str, float]:
    trace = workdir / f"{launcher}-{time.monotonic_ns()}.jsonl"
    # no checkpoints: bare torchrun would not write them (no job folder), so neither side does
    script_args = ["--steps", str(steps), "--log-every", str(steps), "--trace", str(trace),
                   "--checkpoint-every", "0"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if launcher == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={workers}", str(SCRIPT), *script_args]
    else:
        env["GPUFLEET_HOME"] = str(workdir / f"home-{time.monotonic_ns()}")
        argv = [sys.executable, "-m", "gpufleet.cli", "run", "--gpu", "cpu", "--count", str(workers),
                "--cpu-slots", str(workers), "-y", "--warm" if launcher == "warm" else "--no-warm",
                str(SCRIPT), "--", *script_args]
    start = time.time()
    proc = subprocess.run(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=900)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{launcher} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    points = [json.loads(line) for line in trace.read_text().splitlines()]
    first = points[0]
    base = next(p for p in points if p["step"] == warmup)
    last = points[-1]
    samples = sum(p["samples"] for p in points if p["step"] > warmup)
    return {
        "first_step_s": first["t"] - start,
        "samples_per_s": samples / (last["t"] - base["t"]),
        "wall_s": end - start,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5, help="steps excluded from steady samples/s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    sides = ["torchrun", "gpufleet", "warm"]
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for launcher in sides[rep % 3:] + sides[:rep % 3]:
                r = run_once(launcher, args.workers, args.steps, args.warmup, Path(tmp))
                results[launcher].append(r)
                print(f"rep {rep + 1} {launcher:8s} first step {r['first_step_s']:.2f}s "
                      f"samples/s {r['samples_per_s']:.1f} wall {r['wall_s']:.1f}s", file=sys.stderr)

    def med(launcher: str, key: str) -> float:
        return statistics.median(r[key] for r in results[launcher])

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; {args.workers} CPU workers (gloo), "
          f"{args.steps} steps, median of {args.reps}")
    print()
    print("| measure | bare torchrun | gpufleet run --no-warm | gpufleet run --warm | "
          "--no-warm / torchrun | --warm / torchrun |")
    print("|---|---|---|---|---|---|")
    for key, words, fmt in (("first_step_s", "time to first step (s)", ".2f"),
                            ("samples_per_s", "steady samples/s", ".1f"),
                            ("wall_s", "wall time (s)", ".1f")):
        t, g, w = (med(side, key) for side in sides)
        print(f"| {words} | {t:{fmt}} | {g:{fmt}} | {w:{fmt}} | {g / t:.3f} | {w / t:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
