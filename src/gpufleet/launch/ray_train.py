"""Run a training script under Ray Train: `python -m gpufleet.launch.ray_train ... -- SCRIPT ARGS`.

This is the driver gpufleet starts for `--framework ray`. It starts a private Ray instance on
loopback, and a `TorchTrainer` whose workers each run the unchanged script as `__main__`.
Each worker prefixes its output lines with `[rankN]:` as torchrun does, so the supervisor splits
logs per rank the same way, and arms gpufleet's worker bootstrap (step progress for a script
that never imports gpufleet), which torchrun workers get from their sitecustomize but a Ray
worker cannot: its RANK is known only once Ray Train calls the worker function.

The process group. Ray Train joins the default group (gloo on CPU, NCCL on GPUs) and sets
RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT before the script starts; its torch backend
always does (ray/train/torch/config.py, `_TorchBackend.on_start`, Ray 2.60), and a script written
for Ray Train relies on that. So:

- a script that calls `init_process_group` itself (an ordinary torchrun script) would fail with
  "trying to initialize the default process group twice!". Its first call instead replaces Ray
  Train's group by one made with the script's own arguments (backend, timeout, device_id), not
  silently Ray's: a script asking for "cpu:gloo,cuda:nccl" or a longer timeout gets it, as
  under torchrun. It meets its peers on a port rank 0 chose before the script started, not
  Ray's (whose store may still be up while the peers leave), so no rank meets the old group.
- `init_device_mesh`, `gpufleet.train.setup()` and Ray's `ray.train.torch.prepare_model` join
  only when no group exists: they use Ray Train's group as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import runpy
import sys
import threading
from collections.abc import Iterator
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


class ScriptExit(RuntimeError):
    """The script called `sys.exit` with a failing status. Ray Train counts any exception
    leaving the worker function, SystemExit too, as the worker's failure; this one says which
    status the script chose."""


def _fresh_rendezvous() -> tuple[str, int]:
    """MASTER_ADDR and a port free on rank 0's address now, the same on every rank (a barrier:
    every worker calls it). `broadcast_from_rank_zero` goes through Ray, not torch, so it needs
    no process group (https://docs.ray.io/en/latest/train/api/doc/
    ray.train.collective.broadcast_from_rank_zero.html, Ray 2.60)."""
    from ray.train.collective import broadcast_from_rank_zero

    from gpufleet.backends.local import free_port

    addr = os.environ.get("MASTER_ADDR", _LOOPBACK)
    mine = (addr, free_port(addr)) if os.environ.get("RANK") == "0" else None
    chosen: tuple[str, int] = broadcast_from_rank_zero(mine)
    return chosen


@contextlib.contextmanager
def _script_owns_group(rendezvous: tuple[str, int]) -> Iterator[None]:
    """While the script runs, its first `init_process_group` call leaves Ray Train's group and
    joins one of its own at `rendezvous` (see the module docstring). One call only: afterwards,
    and when the script ends, torch's own function is back."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.init_process_group

    def restore() -> None:
        dist.init_process_group = c10d.init_process_group = original

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        restore()
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = rendezvous[0], str(rendezvous[1])
        return original(*args, **kwargs)

    dist.init_process_group = c10d.init_process_group = init_process_group
    try:
        yield
    finally:
        restore()


def _announce() -> None:
    """This rank's pid to the supervisor now. Its sampler finds a torchrun rank by the RANK in
    the process's environment; a Ray worker has RANK only in `os.environ` (set at run time), so
    it is found by the pid it reports, otherwise only at its first step (if anything reports)."""

    from gpufleet.train.report import send_event

    send_event("ray_worker")


def _arm_bootstrap() -> None:
    """Step progress for a script that never imports gpufleet, as torchrun's workers get it.
    Their sitecustomize finds no RANK in a Ray worker's environment at startup; here it is set.
    Torch is already imported (by Ray Train), so the hooks go in at once."""
    from gpufleet import bootstrap

    if bootstrap.enabled(dict(os.environ)):
        from gpufleet.bootstrap import worker

        worker.arm()


def _flush_steps() -> None:
    worker = sys.modules.get("gpufleet.bootstrap.worker")
    if worker is not None:
        worker.flush()


def _run_script(script: str) -> None:
    """The script as `__main__`; `sys.exit(0)` (or no status) is a normal end, as in torchrun."""
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise ScriptExit(f"the script exited with status {exc.code}") from None


def _worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker loop: become the script."""
    rank = int(os.environ.get("RANK", "0"))
    os.environ.update(config["env"])
    os.chdir(config["cwd"])
    sys.stdout = _RankPrefix(sys.stdout, rank)  # type: ignore[assignment]
    sys.stderr = _RankPrefix(sys.stderr, rank)  # type: ignore[assignment]
    sys.argv = [config["script"], *config["args"]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(config["script"])))
    try:  # telemetry must never keep the script from running
        _announce()
    except Exception as exc:
        print(f"gpufleet: no ray_worker note ({exc!r})", file=sys.stderr)
    rendezvous = _fresh_rendezvous()
    try:
        _arm_bootstrap()
    except Exception as exc:
        print(f"gpufleet bootstrap: not armed ({exc!r})", file=sys.stderr)
    try:
        with _script_owns_group(rendezvous):
            _run_script(config["script"])
    finally:
        _flush_steps()  # the worker process outlives the script: atexit would come too late
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
