"""A real multi-node Ray cluster on this machine, for trying gpufleet's pools and for tests.

`gpufleet pool up --local --nodes 3` starts a head and two worker raylets with `ray start`, each
on an address of its own in 127.0.0.0/8 (127.0.P.1 for the head, 127.0.P.2... for workers, P
from the pool name), so the nodes are told apart like separate machines while every byte stays
on loopback. Each node declares its devices as `gpufleet_gpu` resources and labels; they are
simulated (CPU workers with gloo) unless the type is cpu.

The pool uses Ray's token authentication with a token of its own, made at start in the pool's
state folder (`$GPUFLEET_HOME/pools/NAME/`, owner-only; see `ray_auth`) and removed by `stop`:
nothing is read from or written to `~/.ray`, so it starts the same on a machine that never ran
Ray as on one that did.

Ray's processes daemonize, so we find ours again by an environment marker each inherits
(`GPUFLEET_RAY_POOL`, `GPUFLEET_RAY_NODE`: the pool's name and head address, so two pools of one
name in different state folders stay apart) and end exactly those pids: never `ray stop`, which
ends every Ray process of the user.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gpufleet.backends import ray_auth
from gpufleet.backends.proc_tree import terminate
from gpufleet.backends.ray import (
    LABEL_FABRIC,
    LABEL_GPU,
    LABEL_NETWORK,
    LABEL_NODE,
    LABEL_SIMULATED,
    RESOURCE,
)
from gpufleet.errors import ConflictError

POOL_MARK = "GPUFLEET_RAY_POOL"
NODE_MARK = "GPUFLEET_RAY_NODE"
START_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class LocalRay:
    """What `pool up --local` starts: its shape and where it listens."""

    name: str
    nodes: int
    gpu: str
    per_node: int
    fabric: str
    network: str
    head_ip: str
    port: int
    token_file: str = ""  # the pool's own Ray token, made at start (ray_auth); "" for none

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    def node_name(self, i: int) -> str:
        return "head" if i == 0 else f"worker{i}"

    def node_ip(self, i: int) -> str:
        return f"{self.head_ip.rsplit('.', 1)[0]}.{i + 1}"

    @property
    def mark(self) -> str:
        """What the pool's processes carry in their environment: unique while it runs."""
        return f"{self.name}@{self.address}"

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> LocalRay:
        return cls(**json.loads(text))


def subnet_for(name: str) -> str:
    """127.0.P for a pool name: pools of different names on one machine do not collide."""
    return f"127.0.{1 + zlib.crc32(name.encode()) % 250}"


def temp_dir(cfg: LocalRay) -> Path:
    """Ray's session folder; short, because Ray puts unix sockets in it (108-byte limit)."""
    return Path(tempfile.gettempdir()) / f"gpufleet-ray-{os.getuid()}-{cfg.name}-{cfg.port}"


def _ray_exe() -> str:
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if not found:
        raise ConflictError("pool: the `ray` command is not installed; install gpufleet's [ray] extra "
                            "(pip install 'ray[train]==2.60.0')")
    return found


def node_argv(cfg: LocalRay, i: int) -> list[str]:
    labels = {LABEL_NODE: cfg.node_name(i), LABEL_GPU: cfg.gpu, LABEL_FABRIC: cfg.fabric,
              LABEL_NETWORK: cfg.network, LABEL_SIMULATED: "false" if cfg.gpu == "cpu" else "true"}
    argv = [_ray_exe(), "start", "--node-ip-address", cfg.node_ip(i),
            "--num-cpus", str(cfg.per_node), "--num-gpus", "0",
            "--resources", json.dumps({RESOURCE: cfg.per_node}),
            "--labels", ",".join(f"{k}={v}" for k, v in labels.items()),
            "--object-store-memory", str(100 * 2**20), "--disable-usage-stats",
            "--temp-dir", str(temp_dir(cfg))]
    if i == 0:
        return [*argv, "--head", "--port", str(cfg.port), "--include-dashboard", "false"]
    return [*argv, "--address", cfg.address]


def token_path(cfg: LocalRay) -> Path | None:
    return Path(cfg.token_file) if cfg.token_file else None


def _env(cfg: LocalRay, i: int) -> dict[str, str]:
    return {**ray_auth.auth_env(os.environ, token_path(cfg)), POOL_MARK: cfg.mark,
            NODE_MARK: f"{cfg.mark}/{cfg.node_name(i)}"}


_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\b:?\s")
_ERROR_LOG = re.compile(r"\bERROR\b")


def error_line(output: str) -> str:
    """What a failed `ray start` said that matters: the exception its traceback ends with, else
    its last error-level log line, else its last line; never the INFO line that happens to come
    last."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for pattern in (_EXCEPTION_LINE, _ERROR_LOG):
        found = [ln for ln in lines if pattern.search(ln)]
        if found:
            return found[-1]
    return lines[-1] if lines else "no output"


def start_node(cfg: LocalRay, i: int) -> None:
    """`ray start` one node and wait for it to return (Ray daemonizes the node itself)."""
    try:
        done = subprocess.run(node_argv(cfg, i), env=_env(cfg, i), capture_output=True,
                              text=True, timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConflictError(f"pool: node {cfg.node_name(i)} did not start within "
                            f"{START_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise ConflictError(f"pool: `ray start` for node {cfg.node_name(i)} failed: "
                            f"{error_line(done.stdout + chr(10) + done.stderr)}")


def start(cfg: LocalRay, on_node: Any = None) -> None:
    """Make the pool's token, then start every node; on any failure, end what was started and
    remove the token (nothing is left half up)."""
    try:
        path = token_path(cfg)
        if path is not None:
            ray_auth.new_token(path)
        for i in range(cfg.nodes):
            start_node(cfg, i)
            if on_node is not None:
                on_node(cfg.node_name(i), cfg.node_ip(i))
    except BaseException:
        stop(cfg)
        raise


def processes(cfg: LocalRay, node: str | None = None) -> list[psutil.Process]:
    """This user's processes carrying the pool's marker (of one node, if given), and their
    descendants.

    The environment is read as raw bytes, and children are taken by descent: Ray's agents
    (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) rename themselves by writing over their
    environment block, so the marker they inherited may be gone from it."""
    key, value = (NODE_MARK, f"{cfg.mark}/{node}") if node else (POOL_MARK, cfg.mark)
    needle = f"\0{key}={value}\0".encode()
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.uids().real != os.getuid():
                continue
            raw = Path(f"/proc/{p.pid}/environ").read_bytes()
            if needle in b"\0" + raw + b"\0":
                found.append(p)
    for p in list(found):
        with contextlib.suppress(psutil.Error):
            found += [c for c in p.children(recursive=True) if c not in found]
    return found


def stop(cfg: LocalRay, grace_s: float = 5.0) -> int:
    """End the pool's processes: SIGTERM, SIGKILL after `grace_s`; how many there were."""
    procs = processes(cfg)
    terminate(procs, grace_s)
    shutil.rmtree(temp_dir(cfg), ignore_errors=True)
    path = token_path(cfg)
    if path is not None:
        ray_auth.forget(path)
    return len(procs)


def kill_node(cfg: LocalRay, node: str) -> int:
    """SIGKILL one node's raylet, as a machine failure looks to the rest of the cluster; the
    node's other processes go with it (Ray's workers exit when their raylet dies; the rest are
    ended here). Returns the raylet's pid."""
    procs = processes(cfg, node)
    raylet = [p for p in procs if p.name() == "raylet"]
    if not raylet:
        raise ConflictError(f"pool: node {node} of pool {cfg.name} has no raylet running")
    for p in raylet + [p for p in procs if p not in raylet]:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)
    return raylet[0].pid


def wait_nodes(cfg: LocalRay, timeout_s: float = 60.0) -> None:
    """Until Ray lists every node alive (a worker raylet registers a moment after start)."""
    from gpufleet.backends.ray_probe import node_tables

    deadline = time.monotonic() + timeout_s
    while True:
        alive = sum(1 for n in node_tables(cfg.address, token_path(cfg)) if n.get("Alive"))
        if alive >= cfg.nodes:
            return
        if time.monotonic() >= deadline:
            raise ConflictError(f"pool: only {alive} of {cfg.nodes} nodes joined the Ray cluster "
                                f"at {cfg.address} within {timeout_s:.0f} s")
        time.sleep(0.5)
