"""Run a training script under Ray Train: `python -m gpufleet.launch.ray_train ... -- SCRIPT ARGS`.

This is the driver gpufleet starts for `--framework ray`. It starts a private Ray instance on
loopback, and a `TorchTrainer` whose workers each run the unchanged script as `__main__`.
Ray Train has already joined the process group when the script starts, with RANK, WORLD_SIZE
and LOCAL_RANK set, so `gpufleet.train.setup()` finds it ready. Each worker prefixes its output
lines with `[rankN]:` as torchrun does, so the supervisor splits logs per rank the same way.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

# Ray rewrites 127.0.0.1 to the machine's network address; another loopback address stays
# loopback, so a private Ray (and the workers' gloo rendezvous) never leaves the host.
_LOOPBACK = "127.0.0.2"

# Variables the driver hands to every worker: gpufleet's job wiring and the usual tuning knobs.
# Not CUDA_VISIBLE_DEVICES: the driver's Ray sees only the cluster's GPUs and gives each worker
# its own one.
_FORWARD_PREFIXES = ("GPUFLEET_", "OMP_", "MKL_", "NCCL_", "CUDA_DEVICE_ORDER", "PYTHON", "TORCH")


class _RankPrefix:
    """A text stream that starts every line with `[rankN]:`."""

    def __init__(self, inner: TextIO, rank: int) -> None:
        self.inner, self.prefix, self.at_line_start = inner, f"[rank{rank}]:", True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                out.append(self.prefix)
            out.append(piece)
            self.at_line_start = piece.endswith("\n")
        self.inner.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker loop: become the script."""
    rank = int(os.environ.get("RANK", "0"))
    os.environ.update(config["env"])
    os.chdir(config["cwd"])
    sys.stdout = _RankPrefix(sys.stdout, rank)  # type: ignore[assignment]
    sys.stderr = _RankPrefix(sys.stderr, rank)  # type: ignore[assignment]
    sys.argv = [config["script"], *config["args"]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(config["script"])))
    try:
        runpy.run_path(config["script"], run_name="__main__")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _quiet_ray_threads(args: threading.ExceptHookArgs) -> None:
    """Ray Train's placement-group monitor asks the state API, which needs Ray's dashboard (not
    installed by ray[train]); its failure is harmless but prints a long traceback. One line."""
    name = args.thread.name if args.thread is not None else ""
    if "PlacementGroupCleaner" in name:
        print(f"ray train: {name} stopped ({args.exc_type.__name__}); harmless without Ray's "
              "dashboard", file=sys.stderr, flush=True)
        return
    _default_excepthook(args)


_default_excepthook = threading.excepthook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.launch.ray_train")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--gpus-per-worker", type=float, default=0)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--storage", required=True, help="folder for Ray Train's run state")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    threading.excepthook = _quiet_ray_threads
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every rank's lines, not "repeated 2x"
    # Ray Train patches print() in its workers to also log each write, which doubles every line.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    # Token authentication with a token of this job's own, beside Ray Train's run state, set
    # before Ray is imported (its config reads the mode once): a local ray.init otherwise makes
    # one in ~/.ray/auth_token, outside gpufleet's state, and every later Ray on the machine
    # would silently depend on it.
    from gpufleet.backends import ray_auth

    ray_auth.use_here(ray_auth.new_token(Path(args.storage).resolve() / ray_auth.TOKEN_FILE))
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARD_PREFIXES)}
    # A private single-node Ray for this job, on loopback, gone when the driver exits. (An
    # existing Ray cluster's machines are not the devices gpufleet reserved, so RAY_ADDRESS is
    # not followed here.)
    os.environ.pop("RAY_ADDRESS", None)
    # Its GCS port is chosen here and given to its workers as RAY_ADDRESS: Ray Train's own
    # helpers (the placement-group cleaner) otherwise look for "the" local Ray by listing
    # processes, and fail when another Ray (a gpufleet pool, another user's) runs on the machine.
    from gpufleet.backends.local import free_port

    gcs_port = free_port(_LOOPBACK)
    os.environ["RAY_GCS_SERVER_PORT"] = str(gcs_port)
    ray.init(address="local", _node_ip_address=_LOOPBACK, include_dashboard=False,
             num_cpus=max(args.workers + 1, os.cpu_count() or 1),
             num_gpus=int(args.workers * args.gpus_per_worker),
             runtime_env={"env_vars": {**env, "RAY_ADDRESS": f"{_LOOPBACK}:{gcs_port}"}})
    use_gpu = args.gpus_per_worker > 0
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"script": os.path.abspath(args.script), "args": list(args.args),
                           "cwd": os.getcwd(), "env": env},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=use_gpu,
                                     resources_per_worker={"GPU": args.gpus_per_worker} if use_gpu
                                     else {"CPU": 1}),
        run_config=RunConfig(name=os.environ.get("GPUFLEET_JOB", "gpufleet"),
                             storage_path=os.path.abspath(args.storage),
                             failure_config=FailureConfig(max_failures=args.max_restarts)),
    )
    try:
        result = trainer.fit()
    except Exception as exc:  # Ray wraps the worker's error; its traceback is already in the log
        print(f"ray train: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        ray.shutdown()
    return 1 if getattr(result, "error", None) else 0


if __name__ == "__main__":
    sys.exit(main())
