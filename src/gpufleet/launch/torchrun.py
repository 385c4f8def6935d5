"""What every launcher shares: where a job runs, torchrun's per-rank log prefix, and how gpufleet's
environment layers over the caller's (`merge_env`; a run's whole environment is `run_env`'s).

Commands are argument lists only: nothing goes through a shell, so a cluster name or a script
argument cannot inject a command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# torchrun prefixes every worker line with this, so the supervisor can split logs per rank.
LOG_PREFIX_TEMPLATE = "[rank${rank}]:"
_RANK_IDENTITY = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GPUFLEET_BOOTSTRAP_PID"}
_FORCED = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTHONUNBUFFERED",
           "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"}


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


def merge_env(base: dict[str, str], gpufleet: dict[str, str], user: dict[str, str]) -> dict[str, str]:
    """Base (the caller's environment) < gpufleet's presets < the job's own `env`.

    A tuning preset (threads, NCCL) the user already exported in their shell is kept: they asked
    for it. Device pinning and gpufleet's own variables are not: a shell's CUDA_VISIBLE_DEVICES
    must not put a job on devices another cluster holds.
    """
    # a caller's own rank identity (a container that sets RANK, a gpufleet job inside a job)
    # would make torchrun's launcher pass for a rank; torchrun gives each worker its own
    merged = {k: v for k, v in base.items() if k not in _RANK_IDENTITY}
    for key, value in gpufleet.items():
        if key.startswith("GPUFLEET_") or key in _FORCED or key not in base:
            merged[key] = value
    merged.update(user)
    if "PYTHONPATH" in gpufleet:  # the bootstrap's folder goes first; the caller's paths stay
        rest = user.get("PYTHONPATH", base.get("PYTHONPATH", ""))
        merged["PYTHONPATH"] = ":".join(p for p in (gpufleet["PYTHONPATH"], rest) if p)
    return merged


def env_changes(caller: Mapping[str, str], env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """What `env` sets that `caller` does not already have as is, and the names it leaves out."""
    return ({k: v for k, v in env.items() if caller.get(k) != v},
            sorted(k for k in caller if k not in env))
