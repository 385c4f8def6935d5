"""Time to first step on 2 nodes: `gpufleet run` against Ray Train (Ray) or a hand-written sbatch (Slurm).

    .venv/bin/python bench/multinode_launch.py [--engine ray|slurm] [--reps 3] [--steps 5]

`--engine ray` (the default) compares gpufleet with Ray Train's TorchTrainer on one Ray cluster,
as described below. `--engine slurm` compares `gpufleet run --gpu H100 --count 2 --nodes 2` on a
Slurm partition (a new allocation per run) with a hand-written `sbatch --wait` script that runs
the same torchrun with `srun`, on a test Slurm of 2 nodes on loopback; that side lives in
bench/slurm_launch.py, whose docstring says what it measures. Both engines print the same kind
of markdown table of medians and ratios.

Ray: what it measures, and why: how long a user waits from starting a multi-node job until
training has done its first step, when gpufleet drives the Ray cluster (a `NodeAgent` actor per
node, each starting that node's torchrun, see src/gpufleet/backends/ray_run.py) and when Ray
Train does (`TorchTrainer` workers, Ray's own process-group set-up). Both run examples/gpt.py unchanged
(`--steps N --checkpoint-every 0`) as 4 gloo workers on 2 nodes of one real multi-raylet Ray
cluster on loopback (`gpufleet pool up --local --nodes 3 --gpus-per-node 2`, simulated H100s
that run as CPU workers).

- gpufleet: `gpufleet launch --gpu H100 --count 4 --nodes 2 --network infiniband` once, then
  `gpufleet run --cluster C examples/gpt.py -- ...` per repetition, as a subprocess.
- Ray Train: this script in driver mode (`--ray-train-driver ADDRESS`, a subprocess) connects to
  the same cluster and runs `TorchTrainer` with ScalingConfig(num_workers=4, use_gpu=False,
  resources_per_worker={"gpufleet_gpu": 1}); each worker runs examples/gpt.py as `__main__`
  (runpy), with RANK/WORLD_SIZE/LOCAL_RANK as Ray Train sets them. Gloo is kept on `lo`, as
  gpufleet does for loopback nodes. (gpufleet's own Ray Train launcher,
  `python -m gpufleet.launch.ray_train`, cannot be used here: it always starts a private one-node
  Ray and ignores RAY_ADDRESS, and it has no option to ask for `gpufleet_gpu` resources.)

Per repetition, from starting the subprocess: time to first step (rank 0's own clock at the end
of step 1, from the script's `--trace`; for gpufleet also the job's `first_step_at` from the
store, and its job events), when the `step 1/` line reached the launcher's output, and the wall
time to the launcher's exit; and, to see where the time goes, when rank 0's lines "4 ranks
joined" (the process group is up) and "... M params" (data and model built) reached the
launcher's output (both sides print the same lines, with some delay in the forwarding). The
two sides alternate which goes first. Medians and the ratio gpufleet / TorchTrainer are printed
as a markdown table.

The pool lives under a throwaway $GPUFLEET_HOME; its cluster is stopped and the pool brought
down (`gpufleet pool down`) however the run ends, and any Ray process of the pool that outlives
that is ended by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from procs import CLI, ROOT, cli, end_tree, stop_pool

GPT = ROOT / "examples" / "gpt.py"
CLUSTER = "big"
RUN_TIMEOUT_S = 600
# Lines rank 0 of examples/gpt.py prints on both sides, and when they reach the launcher's output
MILESTONES = {"joined": "ranks joined over gloo", "built": "M params,", "line": "step 1/"}


def script_args(steps: int, trace: Path) -> list[str]:
    return ["--steps", str(steps), "--checkpoint-every", "0", "--trace", str(trace)]


def timed_run(argv: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run a launcher, stamping each output line as it arrives: its start, end, and when each
    milestone line first arrived."""
    start = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen: dict[str, float] = {}

    def read() -> None:
        assert proc.stdout is not None
        with log.open("w") as out:
            for line in proc.stdout:
                now = time.time()
                out.write(f"{now - start:8.3f} {line}")
                for key, mark in MILESTONES.items():
                    if mark in line and key not in seen:
                        seen[key] = now

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        end_tree(proc.pid)
        raise RuntimeError(f"{argv[:4]}... did not finish in {RUN_TIMEOUT_S} s; log: {log}") from None
    end = time.time()
    reader.join(timeout=10)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {code}:\n" + log.read_text()[-3000:])
    return {"start": start, "end": end, **{k: seen.get(k) for k in MILESTONES}}


def since(r: dict[str, Any]) -> dict[str, float | None]:
    """Each milestone's arrival, in seconds since the launcher started."""
    return {f"{k}_s": r[k] - r["start"] if r[k] is not None else None for k in MILESTONES}


def first_trace_t(trace: Path) -> float:
    return float(json.loads(trace.read_text().splitlines()[0])["t"])


def gpufleet_once(env: dict[str, str], steps: int, tmp: Path, n: int) -> dict[str, Any]:
    trace = tmp / f"gpufleet-{n}.jsonl"
    argv = [*CLI, "run", "--cluster", CLUSTER, "--name", f"bench{n}", "-y", str(GPT), "--",
            *script_args(steps, trace)]
    r = timed_run(argv, env, tmp / f"gpufleet-{n}.log")
    db = sqlite3.connect(Path(env["GPUFLEET_HOME"]) / "state.db")
    try:
        job_id, created, started, first_at, status, job_dir = db.execute(
            "SELECT id, created_at, started_at, first_step_at, status, job_dir FROM jobs WHERE name = ?",
            (f"bench{n}",)).fetchone()
        events = db.execute("SELECT kind, time FROM job_events WHERE job_id = ? ORDER BY time, id",
                            (job_id,)).fetchall()
    finally:
        db.close()
    t0 = r["start"]
    return {"first_step_s": first_trace_t(trace) - t0, "store_first_step_s": first_at - t0,
            **since(r), "wall_s": r["end"] - t0,
            "created_s": created - t0, "started_s": (started or t0) - t0, "status": status,
            "events": [(k, t - t0) for k, t in events], "threads": threads(Path(job_dir))}


def threads(job_dir: Path) -> str:
    """OMP_NUM_THREADS each node's torchrun got, from the plan the Ray driver ran."""
    found = sorted(job_dir.rglob("ray-plan.json"))
    if not found:
        return "?"
    plan = json.loads(found[-1].read_text())
    return ",".join(sorted({n["env"].get("OMP_NUM_THREADS", "unset") for n in plan["nodes"]}))


def ray_train_once(env: dict[str, str], address: str, steps: int, tmp: Path, n: int) -> dict[str, Any]:
    trace = tmp / f"raytrain-{n}.jsonl"
    argv = [sys.executable, str(Path(__file__).resolve()), "--ray-train-driver", address,
            "--storage", str(tmp / "ray-train"), "--run-name", f"bench{n}", "--",
            *script_args(steps, trace)]
    log = tmp / f"raytrain-{n}.log"
    r = timed_run(argv, env, log)
    t0 = r["start"]
    where = sorted({line.split("ray-train worker: ", 1)[1].strip() for line in log.read_text().splitlines()
                    if "ray-train worker: " in line})
    return {"first_step_s": first_trace_t(trace) - t0, **since(r), "wall_s": r["end"] - t0,
            "workers": where}


# -- Ray Train driver mode ------------------------------------------------------------------------
def train_gpt(config: dict[str, Any]) -> None:
    """Ray Train's per-worker loop: examples/gpt.py as `__main__`, in the repository root."""
    import runpy

    import ray

    os.chdir(config["cwd"])
    print(f"ray-train worker: rank {os.environ.get('RANK')} on {ray.util.get_node_ip_address()} "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", flush=True)
    sys.argv = [config["script"], *config["args"]]
    runpy.run_path(config["script"], run_name="__main__")


def ray_train_driver(address: str, storage: str, run_name: str, args: list[str]) -> int:
    if (Path.home() / ".ray" / "auth_token").exists():  # the pool's Ray uses token auth
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=address, runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo"}},
             logging_level="ERROR")
    try:
        trainer = TorchTrainer(
            train_gpt,
            train_loop_config={"script": str(GPT), "args": args, "cwd": str(ROOT)},
            scaling_config=ScalingConfig(num_workers=4, use_gpu=False,
                                         resources_per_worker={"gpufleet_gpu": 1}),
            run_config=RunConfig(name=run_name, storage_path=storage),
        )
        result = trainer.fit()
        return 1 if getattr(result, "error", None) else 0
    finally:
        ray.shutdown()


# -- the comparison -------------------------------------------------------------------------------
def layout(workers: list[str]) -> str:
    """'rank 0 on 127.0.5.2 OMP_NUM_THREADS=1', ... as '127.0.5.2: 0,1 + 127.0.5.1: 2,3'."""
    by_node: dict[str, list[str]] = {}
    for w in workers:
        parts = w.split()
        by_node.setdefault(parts[3], []).append(parts[1])
    return " + ".join(f"{node}: {','.join(sorted(set(ranks)))}" for node, ranks in
                      sorted(by_node.items(), key=lambda kv: min(kv[1])))


def med(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows if r[key] is not None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("ray", "slurm"), default="ray",
                    help="ray: against Ray Train's TorchTrainer; slurm: against a hand-written sbatch "
                    "(bench/slurm_launch.py)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--pool-name", default=f"benchml-{os.getpid()}", help="ray: the local Ray pool's name")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--logs", type=Path, help="keep each launcher's output here, lines stamped with "
                    "seconds since its start")
    ap.add_argument("--ray-train-driver", metavar="ADDRESS", help=argparse.SUPPRESS)
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    ap.add_argument("--run-name", default="bench", help=argparse.SUPPRESS)
    ap.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ray_train_driver:
        sys.exit(ray_train_driver(args.ray_train_driver, args.storage, args.run_name, args.script_args))
    if args.engine == "slurm":
        import slurm_launch

        slurm_launch.run(args)
        return

    results: dict[str, list[dict[str, Any]]] = {"gpufleet": [], "ray_train": []}
    left: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-multinode-") as tmpdir:
        tmp = Path(tmpdir)
        # RAY_DEDUP_LOGS=0: Ray Train's driver prints every worker's lines, not "repeated 3x"
        env = {**os.environ, "GPUFLEET_HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1",
               "RAY_DEDUP_LOGS": "0"}
        pool, launched = args.pool_name, False
        up_s = launch_s = float("nan")
        try:
            t = time.perf_counter()
            cli(env, "pool", "up", "--local", "--nodes", "3", "--gpus-per-node", "2", "--gpu", "H100",
                "--network", "infiniband", "--name", pool)
            up_s = time.perf_counter() - t
            address = json.loads(cli(env, "pool", "list", pool, "--json"))[0]["where"]
            t = time.perf_counter()
            launched = True
            cli(env, "launch", "--gpu", "H100", "--count", "4", "--nodes", "2", "--network", "infiniband",
                "--name", CLUSTER, "-y")
            launch_s = time.perf_counter() - t
            print(f"pool {pool} at {address} up in {up_s:.1f} s; cluster {CLUSTER} launched in "
                  f"{launch_s:.1f} s", file=sys.stderr)
            for rep in range(args.reps):
                order = ["gpufleet", "ray_train"] if rep % 2 == 0 else ["ray_train", "gpufleet"]
                for side in order:
                    if side == "gpufleet":
                        r = gpufleet_once(env, args.steps, tmp, rep)
                    else:
                        r = ray_train_once(env, address, args.steps, tmp, rep)
                    results[side].append(r)
                    print(f"rep {rep + 1} {side:9s} first step {r['first_step_s']:.2f} s, "
                          f"line {r['line_s'] or float('nan'):.2f} s, wall {r['wall_s']:.2f} s"
                          + (f", workers {r['workers']}" if "workers" in r else ""), file=sys.stderr)
        finally:
            if launched:
                try:
                    cli(env, "stop", CLUSTER, timeout=120)
                except RuntimeError as exc:
                    print(f"stop {CLUSTER}: {str(exc).splitlines()[0]}", file=sys.stderr)
            left = stop_pool(env, pool)
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for f in tmp.glob("*.log"):
                    (args.logs / f.name).write_text(f.read_text())

    g, rt = results["gpufleet"], results["ray_train"]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}; pool of 3 Ray nodes x 2 simulated H100 on loopback; "
          f"examples/gpt.py --steps {args.steps}, 4 gloo workers on 2 nodes; median of {args.reps} "
          "alternating repetitions\n")
    print("| measure | Ray Train TorchTrainer | gpufleet run | gpufleet / TorchTrainer |")
    print("|---|---|---|---|")
    for label, key in (("'4 ranks joined' line in the launcher's output (s)", "joined_s"),
                       ("'M params' line (data and model built) (s)", "built_s"),
                       ("**time to first step (s)**, rank 0's clock at the end of step 1", "first_step_s"),
                       ("`step 1/` line in the launcher's output (s)", "line_s"),
                       ("wall time to the launcher's exit (s)", "wall_s")):
        a, b = med(rt, key), med(g, key)
        print(f"| {label} | {a:.2f} | {b:.2f} | {b / a:.2f}x ({b - a:+.2f} s) |")
    print(f"\nBefore the runs: `pool up` {up_s:.1f} s, `gpufleet launch` of the 4-GPU 2-node cluster "
          f"{launch_s:.1f} s (once; not in gpufleet's times above, as Ray Train has no such step).")
    print(f"gpufleet, from the store (median): job created {med(g, 'created_s'):.2f} s, started "
          f"{med(g, 'started_s'):.2f} s, first_step_at {med(g, 'store_first_step_s'):.2f} s after the "
          "command started.")
    kinds: dict[str, list[float]] = {}
    for r in g:
        firsts: dict[str, float] = {}
        for k, t in r["events"]:
            firsts.setdefault(k, t)
        for k, t in firsts.items():
            kinds.setdefault(k, []).append(t)
    print("gpufleet job events (first of each kind, median s after the command started): "
          + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in kinds.items()))
    print("OMP_NUM_THREADS per worker: gpufleet " + "/".join(sorted({r["threads"] for r in g}))
          + ", Ray Train " + "/".join(sorted({w.split("OMP_NUM_THREADS=")[1] for r in rt
                                              for w in r["workers"]})) + ".")
    print("Ray Train placed its 4 workers (ranks per node, by repetition): " + "; ".join(
        layout(r["workers"]) for r in rt))
    if left:
        print(f"\n`gpufleet pool down` left {len(left)} Ray process(es) running; this script ended "
              f"them: {', '.join(left)}.")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
