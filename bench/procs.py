"""Process helpers shared by the benchmarks: the CLI as a subprocess, and clean-up that ends
only what a benchmark started, by pid."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "gpufleet.cli"]


def cli(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    """`gpufleet ARGS` with `env`; its stdout, or RuntimeError with everything it printed."""
    r = subprocess.run([*CLI, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"gpufleet {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def stop_pool(env: dict[str, str], pool: str) -> list[str]:
    """`gpufleet pool down POOL`, then anything of the pool still alive (ended by pid, and
    reported: it would be a gpufleet bug)."""
    from gpufleet.backends import ray_local
    from gpufleet.backends.local import terminate
    from gpufleet.errors import NotFoundError
    from gpufleet.lifecycle import pools
    from gpufleet.store import Store

    store = Store(url=f"sqlite:///{Path(env['GPUFLEET_HOME']) / 'state.db'}")
    try:
        cfg = ray_local.LocalRay.from_json(pools.get(store, pool).spec_json)
    except NotFoundError:  # `up` failed: it already ended what it started
        return []
    finally:
        store.close()
    try:
        cli(env, "pool", "down", pool, timeout=120)
    except RuntimeError as exc:
        print(f"pool down: {str(exc).splitlines()[0]}", file=sys.stderr)
    left = ray_local.processes(cfg)
    ended = [f"{p.pid} {p.name()}" for p in left]
    terminate(left, 3.0)
    if ended:
        print(f"pool {pool}: `pool down` left {len(ended)} process(es), ended here: "
              f"{', '.join(ended)}", file=sys.stderr)
    return ended


def end_tree(pid: int) -> None:
    """End a process we started and everything under it, by pid (SIGTERM, then SIGKILL)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
