"""The cost of running a job in a container image, against the same job without one, in one run.

Runs examples/gpt.py alternately as `gpufleet run --gpu cpu --count N` and as the same command
with `--image IMAGE` (a fresh $GPUFLEET_HOME each time; both from one temporary workdir holding
a copy of the script, which is where the trace is written: a container sees the workdir, not
the rest of this machine). Per side, the median over repetitions of:

- time to first step: from starting the command to the end of step 1 (start-up, the image's
  preflight and container start on the image side, imports, rendezvous, the first step);
- steady samples/s: samples between the end of step `--warmup` and the last step;

and the ratios image/no image. Then the container start cost on this node: the median wall time
of `RUNTIME run --rm` of the image with the options a job gets, running `python3 -c pass`,
against `python3 -c pass` run here.

    .venv/bin/python bench/image.py --image IMAGE [--reps 3] [--steps 60] [--workers 2]

IMAGE: `scripts/test-image build` prints one made offline (CONTAINERS_CONF as scripts/check
sets it on a machine that needs a test-only podman configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_once(image: str | None, workers: int, steps: int, warmup: int, work: Path) -> dict[str, float]:
    tag = "image" if image else "plain"
    trace = work / f"{tag}-{time.monotonic_ns()}.jsonl"
    script_args = ["--steps", str(steps), "--log-every", str(steps), "--trace", str(trace),
                   "--checkpoint-every", "0"]
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               GPUFLEET_HOME=str(work / f"home-{time.monotonic_ns()}"))
    argv = [sys.executable, "-m", "gpufleet.cli", "run", "--gpu", "cpu", "--count", str(workers),
            "--cpu-slots", str(workers), "-y", *(["--image", image] if image else []),
            "gpt.py", "--", *script_args]
    start = time.time()
    proc = subprocess.run(argv, env=env, cwd=work, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=900)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{tag} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    points = [json.loads(line) for line in trace.read_text().splitlines()]
    base = next(p for p in points if p["step"] == warmup)
    samples = sum(p["samples"] for p in points if p["step"] > warmup)
    return {"first_step_s": points[0]["t"] - start,
            "samples_per_s": samples / (points[-1]["t"] - base["t"]), "wall_s": end - start}


def start_cost(runtime: str, image: str, reps: int) -> tuple[float, float]:
    """Median seconds of a container start running `python3 -c pass`, and of the same here."""
    opts = ["--rm", "--network", "host", "--pid", "host", "--uts", "host", "--ipc", "host"]
    inside, here = [], []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run([runtime, "run", *opts, image, "python3", "-c", "pass"], check=True,
                       stdout=subprocess.DEVNULL)
        inside.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(["python3", "-c", "pass"], check=True)
        here.append(time.perf_counter() - t)
    return statistics.median(inside), statistics.median(here)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--runtime", default=shutil.which("podman") or shutil.which("docker") or "podman")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5, help="steps excluded from steady samples/s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"plain": [], "image": []}
    with tempfile.TemporaryDirectory(dir=ROOT / "bench", prefix=".image-") as tmp:
        work = Path(tmp)
        for name in ("gpt.py", "gpt-config.json"):
            if (EXAMPLES / name).exists():
                shutil.copy(EXAMPLES / name, work / name)
        for rep in range(args.reps):
            order = ["plain", "image"] if rep % 2 == 0 else ["image", "plain"]
            for side in order:
                r = run_once(args.image if side == "image" else None, args.workers, args.steps,
                             args.warmup, work)
                results[side].append(r)
                print(f"rep {rep + 1} {side:6s} first step {r['first_step_s']:.2f}s "
                      f"samples/s {r['samples_per_s']:.1f} wall {r['wall_s']:.1f}s", file=sys.stderr)
    inside, here = start_cost(args.runtime, args.image, max(5, args.reps))

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in results[side])

    p_first, i_first = med("plain", "first_step_s"), med("image", "first_step_s")
    p_sps, i_sps = med("plain", "samples_per_s"), med("image", "samples_per_s")
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; {args.workers} CPU workers (gloo), "
          f"{args.steps} steps, median of {args.reps}; image {args.image} ({args.runtime})")
    print()
    print("| measure | no image | --image | image / no image |")
    print("|---|---|---|---|")
    print(f"| time to first step (s) | {p_first:.2f} | {i_first:.2f} | {i_first / p_first:.2f}x "
          f"(+{i_first - p_first:.2f} s) |")
    print(f"| steady samples/s | {p_sps:.1f} | {i_sps:.1f} | {i_sps / p_sps:.3f} |")
    print(f"| `python3 -c pass` (s): container start cost per node | {here:.2f} | {inside:.2f} | "
          f"+{inside - here:.2f} s |")
    if args.json:
        args.json.write_text(json.dumps({**results, "start": [here, inside]}, indent=1))


if __name__ == "__main__":
    main()
