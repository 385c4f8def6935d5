"""The plan of a run on an SSH pool, and whether its hosts see this machine's files.

Pure but for the pool's discovery and the workdir's selection: `prepare` turns a run into the
driver's plan (`ssh-plan.json`, run by backends/ssh_run.py) with what hosts that share nothing
need besides each node's torchrun: the submitter's job folder, workdir and gpufleet paths (the
node maps them to its own: backends/ssh_node.py), the workdir's digest and cap, the setup
command, whether this is the job's last run, and this gpufleet's version.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import psutil

import gpufleet
from gpufleet.backends import node_restart, ssh_conn
from gpufleet.backends.base import Prepared, RunRequest
from gpufleet.backends.local import free_port
from gpufleet.backends.ssh_conn import Host
from gpufleet.errors import GpufleetError
from gpufleet.launch import multinode, workdir
from gpufleet.pool.model import Node

PLAN_FILE = "ssh-plan.json"  # in the job folder; the driver writes the lost hosts beside it
SEES_TIMEOUT_S = 60.0  # `sees`: as shipping.PROBE_TIMEOUT_S


def prepare(backend: SshPool, run: RunRequest) -> Prepared:
    """The plan for the driver (ssh-plan.json: one `ssh_node run` per host, each running that
    node's torchrun) with what the nodes need that they do not share: the submitter's job
    folder, workdir and gpufleet paths (the node maps them to its own), the workdir's digest,
    the setup command, this gpufleet's version; and the command that runs it."""
    nodes = {n.id: n for n in backend.discover()}
    missing = [p.node_id for p in run.placements if p.node_id not in nodes]
    if missing:
        raise GpufleetError(f"host(s) {', '.join(missing)} of cluster {run.cluster_name} "
                            f"are not in SSH pool {backend.pool}")
    loopback = all(is_loopback(p.address) for p in run.placements)
    plan = multinode.plan(
        run.spec, run.layout, run.placements, nodes, run.ctx,
        port=free_port(run.placements[0].address if loopback else ""), run_id=run.run_id,
        user_env={**run.survive_env, **run.spec.env}, ready_timeout_s=60.0,
        address=backend.pool, loopback=loopback,
        memory_per_slot=psutil.virtual_memory().total // max(1, run.cluster_devices))
    spec: Any = run.spec  # setup/keep_workdir/max_upload_bytes: the workdir part's fields
    cap = getattr(spec, "max_upload_bytes", None) or workdir.DEFAULT_MAX_UPLOAD
    # what travels: the job's workdir, else the script's own folder
    root = Path(run.spec.workdir) if run.spec.workdir else Path(run.spec.script).resolve().parent
    sel = workdir.select(root, cap)  # UploadTooLarge: the run is refused here, with the fix
    plan["ssh"] = {
        "known_hosts": str(backend.known_hosts), "control_dir": str(backend.control_dir),
        "hosts": {p.node_id: backend.host_of(p.node_id).to_json() for p in run.placements},
        # spare nodes: warmed by the driver (workdir, setup) while the run goes on
        "spares": {p.node_id: backend.host_of(p.node_id).to_json() for p in run.spares
                   if p.node_id in nodes},
        "job": run.ctx.job_name, "job_dir": str(run.job_dir), "root": str(sel.root),
        "maps": {"job_dir": str(run.job_dir), "workdir": str(sel.root),
                 "gpufleet": str(Path(gpufleet.__file__).parent)},
        "digest": sel.digest, "max_upload": cap, "setup": getattr(spec, "setup", None) or "",
        "keep_workdir": bool(getattr(spec, "keep_workdir", False)), "final": run.final,
        "version": gpufleet.__version__}
    env = {"GPUFLEET_JOB": run.ctx.job_name, "PYTHONUNBUFFERED": "1"}
    shape = node_restart.offer(plan, env, run.job_dir, run.spec)  # restarts in place
    path = run.job_dir / PLAN_FILE
    files = {k: v for n in plan["nodes"] for k, v in n["files"].items()}
    files[PLAN_FILE] = json.dumps(plan, indent=1)
    return Prepared([sys.executable, "-m", "gpufleet.backends.ssh_run", str(path)], env, files,
                    shape=shape)


def sees(backend: SshPool, node_ids: Sequence[str], path: Path, content: str,
         ) -> dict[str, bool]:
    """For each node, whether it reads exactly `content` at `path` (`cat` over ssh, all hosts
    at once): the SSH engine's `shipping.SharesFiles.sees`. A host that does not answer within
    SEES_TIMEOUT_S, or answers otherwise, does not see it."""
    def one(node_id: str) -> bool:
        argv = ssh_conn.ssh_argv(backend.host_of(node_id), backend.known_hosts,
                                 ["cat", "--", str(path)])
        try:
            done = subprocess.run(argv, capture_output=True, timeout=SEES_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0 and done.stdout == content.encode()

    with ThreadPoolExecutor(max_workers=max(1, len(node_ids))) as pool:
        return dict(zip(node_ids, pool.map(one, node_ids), strict=True))


def check_image(backend: SshPool, node_ids: Sequence[str], container: dict[str, Any],
                ) -> dict[str, str]:
    """Each host's own preflight of the image (its node environment's gpufleet, all hosts at
    once): the SSH engine's `image_nodes.ChecksImages.check_image`."""
    from gpufleet.backends.image_nodes import node_answer
    from gpufleet.backends.image_probe import PROBE_TIMEOUT_S
    from gpufleet.backends.runtime import PULL_TIMEOUT_S

    image = str(container.get("image", ""))

    def one(node_id: str) -> str:
        host = backend.host_of(node_id)
        remote = [host.python, "-m", "gpufleet.backends.image_nodes",
                  json.dumps(container), node_id]
        argv = ssh_conn.ssh_argv(host, backend.known_hosts, remote)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=PULL_TIMEOUT_S + PROBE_TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            return node_answer(None, "", "", image, node_id)
        return node_answer(done.returncode, done.stdout, done.stderr, image, node_id)

    with ThreadPoolExecutor(max_workers=max(1, len(node_ids))) as pool:
        return dict(zip(node_ids, pool.map(one, node_ids), strict=True))


class SshPool(Protocol):
    """What `prepare` needs of the SSH engine (backends/ssh.py)."""

    pool: str
    known_hosts: Path
    control_dir: Path

    def discover(self) -> list[Node]: ...

    def host_of(self, node_id: str) -> Host: ...


def is_loopback(address: str) -> bool:
    return address == "localhost" or address.startswith("127.") or address == "::1"
