"""The torchrun (torch.distributed.run) command for one node of a job, as an argument list.

Argument lists only: nothing here goes through a shell, so a cluster name or a script argument
cannot inject a command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.launch.env import device_env
from gpufleet.pool.model import Placement
from gpufleet.spec import JobSpec

# torchrun prefixes every worker line with this, so the supervisor can split logs per rank.
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"
_FORCED = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED",
           "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"}


@dataclass(frozen=True)
class NodeCommand:
    argv: list[str]
    env: dict[str, str]  # only what gpufleet adds; the caller layers it over the base env


@dataclass(frozen=True)
class JobContext:
    """Where a job runs and reports: everything the builder needs that is not in the spec."""

    job_name: str
    cluster_name: str
    job_dir: Path
    report_addr: str  # host:port of the supervisor's UDP report socket
    fabric: str
    python: str  # interpreter that has torch
    host_cpus: int


def build_torchrun(spec: JobSpec, placement: Placement, ctx: JobContext) -> NodeCommand:
    workers = spec.workers_per_node or len(placement.devices)
    argv = [
        ctx.python, "-m", "torch.distributed.run",
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(workers),
        "--max-restarts", str(spec.max_restarts),
        "--log-dir", str(ctx.job_dir / "torchrun"), "--tee", "3",
        spec.script, *spec.args,
    ]
    env = {
        **device_env(placement, ctx.fabric, ctx.host_cpus, workers),
        "GPUFLEET_JOB": ctx.job_name,
        "GPUFLEET_CLUSTER": ctx.cluster_name,
        "GPUFLEET_JOB_DIR": str(ctx.job_dir),
        "GPUFLEET_REPORT_ADDR": ctx.report_addr,
        "GPUFLEET_STRATEGY": spec.strategy,
        "GPUFLEET_PRECISION": spec.precision,
        "PYTHONUNBUFFERED": "1",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE,
    }
    return NodeCommand(argv=argv, env=env)


def merge_env(base: dict[str, str], gpufleet: dict[str, str], user: dict[str, str]) -> dict[str, str]:
    """Base (the caller's environment) < gpufleet's presets < the job's own `env`.

    A tuning preset (threads, NCCL) the user already exported in their shell is kept: they asked
    for it. Device pinning and gpufleet's own variables are not: a shell's CUDA_VISIBLE_DEVICES
    must not put a job on devices another cluster holds.
    """
    merged = dict(base)
    for key, value in gpufleet.items():
        if key.startswith("GPUFLEET_") or key in _FORCED or key not in base:
            merged[key] = value
    merged.update(user)
    return merged
