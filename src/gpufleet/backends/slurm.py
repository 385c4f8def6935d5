"""A Slurm cluster as a pool: nodes from Slurm's node table, each gpufleet cluster one Slurm
allocation, each run one step per node inside it.

What a node offers is read from what the site already configured for Slurm:

    GRES gpu:TYPE:N        the GPU type (a catalog name: h100, a100, ...) and count
    feature naming a type  the GPU type, for sites whose GRES is untyped (gpu:8)
    feature nvlink/nvswitch  how the node's GPUs reach each other (default pcie)
    feature infiniband/ib  the network to other nodes (default ethernet)
    feature gpufleet-simulated  the GPUs are declared for tests and run as CPU workers
    State                  idle, mixed, allocated, drained, down; drained or down is lost

Slurm does the allocating (`capabilities.allocates`; `alloc.Allocating` here): an allocation
is an `sbatch` job, its pending reason Slurm's own, and `lifecycle.engine_alloc` waits while
Slurm queues it and records what Slurm granted as the cluster's reservation, with the Slurm job
id as `engine_ref`; `stop` cancels it.
A run is `gpufleet.backends.slurm_run`, a local driver that starts one `srun` step per node.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

from gpufleet.backends import alloc, node_restart
from gpufleet.backends import slurm_cmds as cmds
from gpufleet.backends import slurm_parse as parse
from gpufleet.backends.base import Prepared, RunRequest
from gpufleet.backends.driver_procs import DriverProcs
from gpufleet.backends.exits import lost_line, take_lost
from gpufleet.backends.kinds import CAPABILITIES, Capabilities, Kind
from gpufleet.backends.local import free_port
from gpufleet.backends.shipping import PROBE_TIMEOUT_S
from gpufleet.errors import AllocationError, ConflictError, GpufleetError
from gpufleet.launch import multinode
from gpufleet.pool.model import Node

PLAN_FILE = "slurm-plan.json"  # in the job folder; the driver writes the lost nodes beside it
CLIENT = ("sinfo", "scontrol", "sbatch", "srun", "scancel", "squeue")


def is_loopback(address: str) -> bool:
    return address == "localhost" or address.startswith("127.") or address == "::1"


class SlurmBackend(DriverProcs):
    """Slurm through its client commands on this machine (a login node): no daemon of ours
    runs anywhere but the steps Slurm starts. `slurm_conf`: the SLURM_CONF the pool was added
    with (None: Slurm's default configuration). `python`: the nodes' interpreter (`pool add
    slurm --python`; None: this machine's own path, as on a cluster whose nodes share it)."""

    kind: Kind = "slurm"
    name = "slurm"
    capabilities: Capabilities = CAPABILITIES["slurm"]
    pids_here = False  # workers run in Slurm steps; a pid in a report is not ours to inspect

    def __init__(self, pool: str, partition: str | None = None, account: str | None = None,
                 slurm_conf: str | None = None, python: str | None = None):
        self.pool, self.partition, self.account, self.slurm_conf = pool, partition, account, slurm_conf
        self.python = python
        self.init_procs()
        self.seen: list[parse.SlurmNode] = []

    # -- talking to Slurm -----------------------------------------------------------------------
    def driver_env(self, env: dict[str, str]) -> dict[str, str]:
        return self.env(env)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def call(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm client command; a missing client or a controller that does not answer is
        one clear line."""
        if shutil.which(argv[0]) is None:
            raise ConflictError(f"pool {self.pool}: Slurm's `{argv[0]}` is not on PATH; this "
                                "machine needs the Slurm client commands (Debian: apt-get "
                                "install slurm-client)")
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  env=self.env(), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ConflictError(f"pool {self.pool}: `{cmds.line(argv)}` got no answer in "
                                f"{timeout:.0f} s; is slurmctld up?") from None

    def checked(self, argv: list[str]) -> str:
        done = self.call(argv)
        if done.returncode != 0:
            raise ConflictError(f"pool {self.pool}: {_first(done.stderr) or cmds.line(argv)} "
                                f"(`{cmds.line(argv)}` exited {done.returncode})")
        return done.stdout

    def slurm_nodes(self) -> list[parse.SlurmNode]:
        found = parse.nodes_of(self.checked(cmds.show_nodes()), self.partition)
        self.seen = found
        return found

    def discover(self) -> list[Node]:
        return [n.node for n in self.slurm_nodes()]

    def default_partition(self) -> str | None:
        return parse.default_partition(self.checked(cmds.show_partitions()))

    def partitions(self) -> list[str]:
        return parse.partitions(self.checked(cmds.show_partitions()))

    # -- allocations (alloc.Allocating: lifecycle.engine_alloc decides; these only ask) -------
    engine_name = "Slurm"
    alloc_word = "Slurm job"

    @property
    def where(self) -> str:
        return f"partition {self.partition or '(default)'}"

    def sbatch_ask(self, ask: alloc.Ask) -> cmds.Ask:
        """The sbatch request for `ask`, its GPUs named the way this partition's nodes name
        that type (and, where its nodes differ in network, constrained to the feature that
        names the asked one)."""
        typed = [n for n in (self.seen or self.slurm_nodes())
                 if n.node.devices and n.node.devices[0].gpu == ask.gpu]
        gres_type = next((n.gres_type for n in typed if n.gres_type), "")
        feature = "" if gres_type else next((n.feature_type for n in typed if n.feature_type), "")
        if ask.network and len({n.node.inter_fabric for n in typed}) > 1:
            names = next((f for n in typed for f in n.features
                          if parse.NETWORK_FEATURES.get(f.lower()) == ask.network), "")
            feature = "&".join(f for f in (feature, names) if f)
        per_gpu = [(n.cpus // len(n.node.devices), n.memory_mb // len(n.node.devices))
                   for n in typed if n.node.devices]
        # spares: nodes of the same allocation, which outlives a node's failure (--no-kill),
        # so that a heal takes one at once instead of waiting in the queue for a new allocation
        held = ask.nodes + ask.spares
        return cmds.Ask(
            cluster=ask.cluster, nodes=held, per_node=ask.per_node, gres_type=gres_type,
            feature=feature, partition=self.partition, account=self.account,
            time_limit_s=ask.time_limit_s, exclude=ask.exclude, whole_nodes=held > 1,
            no_kill=ask.spares > 0,
            cpus_per_gpu=max(1, min(c for c, _ in per_gpu)) if per_gpu else 0,
            mem_per_gpu_mb=min(m for _, m in per_gpu) if per_gpu else 0, user=ask.user)

    def request(self, ask: alloc.Ask) -> tuple[str, str]:
        """sbatch: the new Slurm job's id and its shape; what sbatch refuses at once is an
        AllocationError with Slurm's own reason."""
        sb = self.sbatch_ask(ask)
        done = self.call(cmds.sbatch(sb))
        shape = f"{sb.nodes} node(s) x --gres={sb.gres}" + (
            f", {ask.spares} of them spare (--no-kill)" if ask.spares else "")
        if done.returncode != 0:
            why = _first(done.stderr).removeprefix("sbatch: error: ")
            raise AllocationError(f"slurm: {why or 'sbatch refused the request'} (partition "
                                  f"{sb.partition or 'default'}: {shape})")
        return done.stdout.strip().split(";", 1)[0], shape

    def job(self, job_id: str) -> parse.SlurmJob | None:
        """The job as Slurm shows it; None once Slurm has forgotten it."""
        done = self.call(cmds.show_job(job_id))
        if done.returncode != 0:
            return None
        return parse.job_of(done.stdout.strip())

    def state(self, ref: str) -> alloc.AllocState:
        return state_of(self.job(ref))

    def cancel(self, ref: str) -> None:
        """scancel; a job Slurm has already forgotten is fine."""
        done = self.call(cmds.scancel(ref))
        if done.returncode != 0 and not any(gone in done.stderr for gone in (
                "Invalid job id", "already completing or completed")):
            raise ConflictError(f"pool {self.pool}: scancel {ref}: {_first(done.stderr)}")

    def queued(self) -> list[alloc.Queued]:
        """gpufleet's jobs in Slurm's queue (squeue)."""
        done = self.call(cmds.mine(), timeout=10.0)
        out = []
        for row in done.stdout.splitlines():
            parts = row.split("|")
            if len(parts) == 5 and parts[1].startswith(cmds.JOB_PREFIX):
                out.append(alloc.Queued(parts[0], parts[2], parse.reason_text(parts[3]),
                                        parts[4], pending=parts[2] == "PENDING"))
        return out

    def dry_run(self, ask: alloc.Ask | None, ref: str, node_ids: list[str],
                job_dir: Path) -> list[str]:
        """The sbatch of a new allocation (`ask`), then one srun step per node."""
        from gpufleet.backends.slurm_run import node_argv

        plan_path = job_dir / PLAN_FILE
        lines = [cmds.line(cmds.sbatch(self.sbatch_ask(ask)))] if ask is not None else []
        return lines + [cmds.line(cmds.srun(ref, node, node_argv(i, plan_path, self.python)))
                        for i, node in enumerate(node_ids)]

    def shell(self, ref: str, node_id: str, argv: list[str],
              env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """An srun step on the node inside the allocation (with a terminal for a shell)."""
        return cmds.shell(ref, node_id, argv), self.env(env)

    # -- runs -----------------------------------------------------------------------------------
    def driver_argv(self, plan_path: Path) -> list[str]:
        return [sys.executable, "-m", "gpufleet.backends.slurm_run", str(plan_path)]

    def prepare(self, run: RunRequest) -> Prepared:
        """The plan for the driver (slurm-plan.json: one srun step per node, each running that
        node's torchrun) and the command that runs it."""
        if not run.engine_ref:
            raise GpufleetError(f"cluster {run.cluster_name} has no Slurm allocation; stop it "
                                "and launch it again")
        head = run.placements[0].address
        loopback = all(is_loopback(p.address) for p in run.placements)
        nodes = {n.id: n for n in self.discover()}
        missing = [p.node_id for p in run.placements if p.node_id not in nodes]
        if missing:
            raise GpufleetError(f"node(s) {', '.join(missing)} of cluster {run.cluster_name} "
                                f"are not in Slurm partition {self.partition or '(default)'}")
        plan = multinode.plan(
            run.spec, run.layout, run.placements, nodes, run.ctx,
            port=free_port(head if loopback else ""), run_id=run.run_id,
            user_env={**run.survive_env, **run.spec.env}, ready_timeout_s=60.0,
            address=self.pool, loopback=loopback,
            memory_per_slot=psutil.virtual_memory().total // max(1, run.cluster_devices))
        plan["job_id"] = run.engine_ref
        # spares: nodes of the same allocation no step uses, warmed by the driver (slurm_spares)
        plan["spares"] = [{"node_id": p.node_id} for p in run.spares]
        plan["spared"] = run.spared or bool(run.spares)  # the job's mark to drop at its end
        plan["final"] = run.final
        plan["slurm_conf"] = self.slurm_conf
        plan["node_python"] = self.python
        env = {"GPUFLEET_JOB": run.ctx.job_name, "PYTHONUNBUFFERED": "1"}
        shape = node_restart.offer(plan, env, run.job_dir, run.spec)  # restarts in place
        path = run.job_dir / PLAN_FILE
        files = {k: v for n in plan["nodes"] for k, v in n["files"].items()}
        files[PLAN_FILE] = json.dumps(plan, indent=1)
        return Prepared(self.driver_argv(path), env, files, shape=shape)

    def node_lost(self, code: int, lines: list[str]) -> str | None:
        """The driver exits NODE_LOST_EXIT after a line `NodeLostError: ...`."""
        return lost_line(code, lines)

    def sees(self, node_ids: Sequence[str], path: Path, content: str,
             ref: str = "") -> dict[str, bool]:
        """shipping.SharesFiles: one step over the allocation `ref` in which each node prints
        what it reads at `path`. A step that fails or does not end within the probe's limit
        leaves the nodes it did not hear from unseen."""
        if not ref or not node_ids:
            return {}
        try:
            done = self.call(cmds.sees_step(ref, list(node_ids), str(path)),
                             timeout=PROBE_TIMEOUT_S)
        except ConflictError:
            return {}
        return cmds.seen_by(done.stdout, content)

    def lost_nodes(self, job_dir: Path) -> set[str]:
        """The nodes the driver named lost (Slurm may not have marked them down yet)."""
        return take_lost(job_dir / PLAN_FILE)

    def report_host(self) -> str:
        """Loopback when the nodes are this machine's loopback addresses; else the address our
        route to the first node leaves from."""
        addresses = [n.node.address for n in (self.seen or self.slurm_nodes())]
        if not addresses or all(is_loopback(a) for a in addresses):
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(addresses[0]), 9))  # UDP: picks a route only
            return str(probe.getsockname()[0])








def state_of(job: parse.SlurmJob | None) -> alloc.AllocState:
    """A Slurm job in gpufleet's words: running with its grants, ended (or forgotten), or
    pending with Slurm's reason (a job Slurm shows running before it lists the grants is still
    pending, with no reason)."""
    if job is None or job.ended:
        return alloc.Ended(job.state if job else "gone from Slurm's queue")
    if job.running and job.grants:
        return alloc.Granted(job.grants)
    reason = "" if job.running or job.reason == "None" else job.reason
    return alloc.Pending(reason, parse.reason_text(reason), parse.never_clears(reason))


def _first(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
