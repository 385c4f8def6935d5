"""The planner's two promises, measured: speed of a whole-catalog ranking, and accuracy of a
calibrated prediction against real CPU runs.

    .venv/bin/python bench/planner.py [--skip-accuracy] [--repeats 5]

Speed: `recommend.rank` in-process over the catalog (every GPU type x count x network x layout)
for three models, and `gpufleet plan --deadline 24h` end to end as a user runs it (a fresh
Python process: imports included), median of --repeats.

Accuracy: on a 2-slot CPU cluster in a throwaway $GPUFLEET_HOME, `bench allreduce` and `bench
scaling` (example GPT, micro-batch 16) write a calibration; then `bench scaling` measures
micro-batches 32 and 64 at 1 and 2 workers, and `plan --calibration` predicts each. Prints
predicted / measured. Stops its cluster and leaves nothing running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "gpufleet.cli"]
GPT, CONFIG = str(ROOT / "examples" / "gpt.py"), str(ROOT / "examples" / "gpt-config.json")


def speed(repeats: int) -> None:
    from gpufleet import catalog
    from gpufleet.plan import models, recommend
    from gpufleet.plan.estimate import Workload

    print("## Ranking speed (whole catalog, --deadline 24h)\n")
    print("| model | clusters considered | qualifying | in-process median (ms) |")
    print("|---|---|---|---|")
    for name in ("llama3-8b", "llama3-70b", "llama3-405b"):
        model = models.from_catalog(catalog.models()[name])
        work = Workload(model=model, seq=4096, samples=50000, recompute="full")
        times, r = [], None
        for _ in range(repeats):
            t = time.perf_counter()
            r = recommend.rank(work, deadline_h=24)
            times.append(time.perf_counter() - t)
        assert r is not None
        print(f"| {name} | {r.considered} | {len(r.ranked)} | {statistics.median(times) * 1e3:.1f} |")
    walls = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([*CLI, "plan", "--model", "llama3-70b", "--samples", "50000", "--deadline", "24h",
                        "--checkpointing"], check=True, capture_output=True)
        walls.append(time.perf_counter() - t)
    print(f"\n`gpufleet plan --model llama3-70b --samples 50000 --deadline 24h --checkpointing`, end to end: "
          f"median {statistics.median(walls):.2f} s (min {min(walls):.2f}, max {max(walls):.2f}) "
          f"over {repeats} runs\n")


def run(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    r = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"gpufleet {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def scaling(env: dict[str, str], out: Path, batch: int, steps: int) -> dict[int, float]:
    data = json.loads(run(env, "bench", "scaling", "--cluster", "acc", "--script", GPT, "--workers", "1,2",
                          "--config", CONFIG, "--out", str(out), "--json", "--", "--config", CONFIG,
                          "--steps", str(steps), "--batch-size", str(batch), "--checkpoint-every", "0",
                          "--log-every", "10"))
    return {row["workers"]: row["samples_per_s"] for row in data["rows"]}


def accuracy() -> None:
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-planner-") as tmp:
        env = {**os.environ, "GPUFLEET_HOME": str(Path(tmp) / "home"), "GPUFLEET_CPU_SLOTS": "2"}
        cal = Path(tmp) / "cal.json"
        run(env, "launch", "--gpu", "cpu", "--count", "2", "--name", "acc", "-y")
        try:
            run(env, "bench", "allreduce", "--cluster", "acc", "--out", str(cal), "--json")
            calibrated = scaling(env, cal, 16, 120)
            print("## Calibrated prediction vs measurement (example GPT, 470,528 params, seq 64, CPU)\n")
            print(f"Calibration at micro-batch 16: {calibrated[1]:.0f} samples/s on 1 worker, "
                  f"{calibrated[2]:.0f} on 2.\n")
            print("| micro-batch | workers | predicted samples/s | measured samples/s "
                  "| predicted / measured |")
            print("|---|---|---|---|---|")
            for batch in (32, 64):
                measured = scaling(env, Path(tmp) / f"m{batch}.json", batch, 120 * 16 // batch)
                for n, got in measured.items():
                    plan = json.loads(run(env, "plan", "--config", CONFIG, "--gpu", "cpu", "--count", str(n),
                                          "--micro-batch", str(batch), "--precision", "fp32",
                                          "--calibration", str(cal), "--json"))
                    want = plan["samples_per_s"]
                    print(f"| {batch} | {n} | {want:.0f} | {got:.0f} | {want / got:.2f} |")
        finally:
            run(env, "stop", "acc")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-accuracy", action="store_true")
    args = p.parse_args()
    speed(args.repeats)
    if not args.skip_accuracy:
        accuracy()


if __name__ == "__main__":
    main()
