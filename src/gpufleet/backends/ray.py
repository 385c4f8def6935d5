"""An existing Ray cluster as a pool: nodes from Ray's node table, jobs through Ray actors.

What a node offers is read from its Ray resources and labels, so an operator describes a node
once, where they start it (`ray start --resources ... --labels ...`):

    label gpufleet/gpu        catalog GPU type (else Ray's ray.io/accelerator-type, else cpu)
    resource gpufleet_gpu     devices gpufleet may use (else Ray's GPU resource)
    label gpufleet/fabric     pcie | nvlink | nvswitch between the node's GPUs (default pcie)
    label gpufleet/network    infiniband | ethernet to other nodes (default ethernet)
    label gpufleet/simulated  true: the devices are declared for tests and run as CPU workers
    label gpufleet/node       a stable node name (default: the start of Ray's node id)

A node Ray lists as dead is kept, unhealthy, so `pool list` shows it lost. Jobs run through
`gpufleet.backends.ray_run`, one local driver process per run of a job that starts a
`NodeAgent` actor on every node of the cluster (see there).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from gpufleet import catalog
from gpufleet.backends import node_restart
from gpufleet.backends.base import Prepared, RunRequest
from gpufleet.backends.driver_procs import DriverProcs
from gpufleet.backends.exits import lost_line, take_lost
from gpufleet.backends.kinds import CAPABILITIES, Capabilities, Kind
from gpufleet.backends.local import free_port
from gpufleet.backends.ray_auth import auth_env, use_here
from gpufleet.backends.shipping import PROBE_TIMEOUT_S
from gpufleet.errors import ConflictError, GpufleetError
from gpufleet.launch import multinode
from gpufleet.pool.model import FABRIC_LEVEL, Device, Node
from gpufleet.vocab import INTER_NODE_NETWORKS

LABEL_GPU = "gpufleet/gpu"
LABEL_FABRIC = "gpufleet/fabric"
LABEL_NETWORK = "gpufleet/network"
LABEL_SIMULATED = "gpufleet/simulated"
LABEL_NODE = "gpufleet/node"
RESOURCE = "gpufleet_gpu"
NETWORKS = INTER_NODE_NETWORKS
NAMESPACE = "gpufleet"
PLAN_FILE = "ray-plan.json"  # in the job folder; the driver writes the lost nodes beside it


def _count(resources: dict[str, float], key: str) -> int:
    return int(resources.get(key, 0) + 1e-9)


def node_from_ray(raw: dict[str, Any]) -> Node:
    """One entry of `ray.nodes()` as a pool node (pure, so it is tested without Ray)."""
    labels: dict[str, str] = raw.get("Labels") or {}
    resources: dict[str, float] = raw.get("Resources") or {}
    ray_id = str(raw.get("NodeID", ""))
    alive = bool(raw.get("Alive"))
    name = labels.get(LABEL_NODE) or ray_id[:12]
    typed = labels.get(LABEL_GPU) or labels.get("ray.io/accelerator-type") or next(
        (k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")), "")
    gpu: catalog.GpuType | None = None
    if typed:
        with contextlib.suppress(Exception):
            gpu = catalog.resolve_gpu(typed)
    count = _count(resources, RESOURCE) or _count(resources, "GPU")
    if not typed and not count:  # a CPU-only Ray node: no devices for gpufleet
        gpu = catalog.gpu_types()["cpu"]
    simulated = labels.get(LABEL_SIMULATED, "").lower() in ("1", "true", "yes")
    type_name = gpu.name if gpu else f"unknown:{typed or 'GPU'}"
    mem = int(gpu.memory_gb * 1e9) if gpu else 0
    fabric = labels.get(LABEL_FABRIC, "pcie")
    fabric = fabric if fabric in FABRIC_LEVEL else "pcie"
    network = labels.get(LABEL_NETWORK, "ethernet")
    peers = range(count) if fabric != "pcie" else ()
    devices = tuple(
        Device(id=f"{'cpu' if type_name == 'cpu' else 'gpu'}{i}", index=i, gpu=type_name,
               memory_bytes=mem, healthy=alive and gpu is not None, simulated=simulated,
               nvlink_peers=tuple(p for p in peers if p != i))
        for i in range(count))
    return Node(id=name, address=str(raw.get("NodeManagerAddress", "")), devices=devices,
                gpu_fabric=fabric, inter_fabric=network if network in NETWORKS else "ethernet",
                free_disk_bytes=1 << 62, healthy=alive, ref=ray_id)


def nodes_from_ray(raw: list[dict[str, Any]]) -> list[Node]:
    """Every node once: a node that rejoined (same gpufleet/node label, new Ray id) shows as
    its live entry, a node that left and did not come back as lost."""
    by_name: dict[str, Node] = {}
    for entry in raw:
        node = node_from_ray(entry)
        old = by_name.get(node.id)
        if old is None or (node.healthy and not old.healthy):
            by_name[node.id] = node
    return sorted(by_name.values(), key=lambda n: (n.id != "head", n.id))


def connect(address: str, token_path: Path | None) -> Any:
    """`ray.init` to an existing cluster from this process (the job's driver), once; returns
    the module. The pool's auth settings go into this process's environment first, where Ray's
    client reads them; the cluster is probed first, so a refused token or an absent head is one
    clear line instead of Ray's 20 s of retries. Ray's own start-up chatter is kept off the
    terminal."""
    from gpufleet.backends import ray_probe

    use_here(token_path)  # before Ray is imported: its config reads the mode once
    try:
        import ray
    except ImportError:
        raise ConflictError("pool: Ray is not installed here; install gpufleet's [ray] extra "
                            "(pip install 'ray[train]==2.60.0')") from None
    if ray.is_initialized():
        return ray
    ray_probe.node_tables(address, token_path)
    os.environ.update(version_env(os.environ))
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stderr(quiet):
            ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR",
                     log_to_driver=False, configure_logging=False)
    except Exception as exc:  # ConnectionError, timeouts: one line for the user
        raise ConflictError(init_error_line(address, str(exc).strip() or type(exc).__name__,
                                            ray_probe.HINT)) from None
    return ray


MATCH_LEVEL_ENV = "RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL"


def version_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a driver's environment needs so that Ray compares Pythons by major.minor only.

    Ray refuses a driver whose Python differs from the cluster's in the patch level (3.11.7
    against 3.11.2) unless this is `minor`. The submitter (a laptop, a login node) and nodes an
    admin installed rarely agree on the patch, and what the driver sends (gpufleet's agent by
    its module's name, plain data) reads the same on any patch of one minor version. A level
    the user set is kept."""
    return {} if MATCH_LEVEL_ENV in environ else {MATCH_LEVEL_ENV: "minor"}


def init_error_line(address: str, text: str, hint: str) -> str:
    """`ray.init`'s failure as one line: Ray's version mismatch spans lines (the cluster's Ray
    and Python, then ours), said whole and without the hint about a head that is not running."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].startswith("Version mismatch"):
        versions = [ln for ln in lines if ln.startswith(("Ray:", "Python:"))]
        if len(versions) == 4:
            return (f"pool: the Ray cluster at {address} runs {versions[0]}, {versions[1]}; this "
                    f"machine has {versions[2]}, {versions[3]}: Ray needs the same Ray version "
                    "and Python major.minor on the nodes and the submitter")
    return f"pool: cannot reach the Ray cluster at {address}: {lines[0] if lines else text} {hint}"


class RayBackend(DriverProcs):
    """Discovery from Ray's node table (asked by `ray_probe`, in a child process); processes
    through a local driver (`ray_run`) that the supervisor starts, watches and ends like any
    local process tree. `token_path` is the pool's copy of the cluster's token (None: the
    cluster does not use token authentication)."""

    kind: Kind = "ray"
    name = "ray"
    capabilities: Capabilities = CAPABILITIES["ray"]

    def __init__(self, pool: str, address: str, token_path: Path | None = None,
                 token_source: str | None = None, adding: bool = False):
        from gpufleet.backends import ray_probe

        self.pool, self.address, self.token_path = pool, address, token_path
        self.token_source = token_source or f"pool {pool}'s copy ({token_path})"
        # A refused token: while `pool add` runs, give one; for a pool added before (its
        # cluster restarted with a new token, say), add it again.
        self.fix = ray_probe.ADD_FIX if adding else (
            f"add the pool again with the cluster's token: gpufleet pool remove {pool} && "
            f"gpufleet pool add ray --address {address} --name {pool} --token-file PATH")
        self.init_procs()

    def discover(self) -> list[Node]:
        from gpufleet.backends import ray_probe

        return nodes_from_ray(ray_probe.node_tables(self.address, self.token_path,
                                                    self.token_source, fix=self.fix))

    def driver_argv(self, plan_path: Path) -> list[str]:
        return [sys.executable, "-m", "gpufleet.backends.ray_run", str(plan_path)]

    @property
    def pids_here(self) -> bool:
        """Worker pids in reports name processes on this machine only for a pool on loopback."""
        return is_loopback(self.address)

    def node_lost(self, code: int, lines: list[str]) -> str | None:
        """The driver exits NODE_LOST_EXIT after a line `NodeLostError: ...`."""
        return lost_line(code, lines)

    def report_host(self) -> str:
        """Loopback, unless the job's nodes are other machines, which reach us at the address
        our route to the pool leaves from."""
        if is_loopback(self.address):
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((self.address.rsplit(":", 1)[0], 9))  # UDP: picks a route, sends nothing
            return str(probe.getsockname()[0])

    def prepare(self, run: RunRequest) -> Prepared:
        """The plan for the Ray driver (ray-plan.json: one torchrun per node) and the command
        that runs it."""
        nodes = {n.id: n for n in self.discover()}
        missing = [p.node_id for p in run.placements if p.node_id not in nodes]
        if missing:
            raise GpufleetError(f"node(s) {', '.join(missing)} of cluster {run.cluster_name} "
                                "are not in the Ray cluster")
        head = run.placements[0].address
        loopback = is_loopback(head)
        plan = multinode.plan(
            run.spec, run.layout, run.placements, nodes, run.ctx,
            port=free_port(head if loopback else ""), run_id=run.run_id,
            user_env={**run.survive_env, **run.spec.env}, ready_timeout_s=60.0,
            address=self.address, loopback=loopback,
            memory_per_slot=psutil.virtual_memory().total // max(1, run.cluster_devices))
        # spare nodes (`--spares`): warmed by the driver while the run goes on (ray_spares.py)
        plan["spares"] = [{"node_id": p.node_id, "ray_id": nodes[p.node_id].ref,
                           "address": p.address} for p in run.spares
                          if p.node_id in nodes and nodes[p.node_id].healthy]
        plan["final"] = run.final
        env = {"GPUFLEET_JOB": run.ctx.job_name, "PYTHONUNBUFFERED": "1"}
        shape = node_restart.offer(plan, env, run.job_dir, run.spec)  # restarts in place
        path = run.job_dir / PLAN_FILE
        files = {k: v for n in plan["nodes"] for k, v in n["files"].items()}
        files[PLAN_FILE] = json.dumps(plan, indent=1)
        return Prepared(self.driver_argv(path), env, files, shape=shape)


    def driver_env(self, env: dict[str, str]) -> dict[str, str]:
        return auth_env(env, self.token_path)

    def lost_nodes(self, job_dir: Path) -> set[str]:
        """The nodes the driver named lost (Ray may not have marked them dead yet)."""
        return take_lost(job_dir / PLAN_FILE)

    def sees(self, node_ids: Sequence[str], path: Path, content: str,
             ref: str = "") -> dict[str, bool]:
        """shipping.SharesFiles: a tiny task pinned to each node reads `path`, run by
        `python -m gpufleet.backends.ray_sees` in a child (Ray stays out of this process). A
        node whose task did not answer, or a child that failed, is left out: unseen."""
        nodes = {n.id: n for n in self.discover()}
        ray_ids = {i: nodes[i].ref for i in node_ids if i in nodes and nodes[i].healthy}
        if not ray_ids:
            return {}
        argv = [sys.executable, "-m", "gpufleet.backends.ray_sees", self.address, str(path),
                content, *ray_ids.values()]
        try:
            done = subprocess.run(argv, env=auth_env(os.environ, self.token_path),
                                  capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
            answer = json.loads(done.stdout.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, IndexError, ValueError):
            return {}
        return {node: bool(answer[rid]) for node, rid in ray_ids.items() if rid in answer}


def is_loopback(address: str) -> bool:
    """For a host or HOST:PORT ([::1]:PORT for IPv6)."""
    host = address
    if address.startswith("["):
        host = address[1:].split("]", 1)[0]
    elif address.count(":") == 1:
        host = address.split(":", 1)[0]
    return host == "localhost" or host.startswith("127.") or host == "::1"
