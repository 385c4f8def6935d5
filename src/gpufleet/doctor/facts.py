"""Gathering one node's facts for the doctor: NVML, torch, the environment, limits, disks.

Every side effect of `gpufleet doctor` lives here (and in `allreduce.run`); `checks` judges the
result. torch and pynvml are imported only inside the functions that need them. Each gatherer
returns what it saw, or why it saw nothing, rather than raising: a broken driver is a finding.
"""

from __future__ import annotations

import os
import resource
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet import catalog
from gpufleet.backends.local import bus_id, nvlink_remotes
from gpufleet.doctor import allreduce
from gpufleet.doctor.model import (
    NVML_TOPOLOGY_LABELS,
    Disk,
    GpuTypeFacts,
    NodeFacts,
    Shm,
    Target,
    Topology,
    Versions,
)
from gpufleet.doctor.state_check import state_facts
from gpufleet.errors import GpufleetError
from gpufleet.home import home_path
from gpufleet.launch.env import device_env
from gpufleet.launch.torchrun import merge_env
from gpufleet.pool.model import Device, Node, Placement


@dataclass(frozen=True)
class NvmlFacts:
    error: str | None  # why NVML answered nothing; None when it did
    driver: str | None = None
    cuda_driver: str | None = None  # "12.4"
    topology: Topology | None = None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_facts(nvml: Any = None) -> NvmlFacts:
    """Driver versions and pairwise GPU topology from NVML. `nvml` is the pynvml module, or a
    stand-in with the same functions (tests have no GPU)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return NvmlFacts("pynvml is not installed (pip install nvidia-ml-py)")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return NvmlFacts(str(exc) or type(exc).__name__)
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        raw = int(nvml.nvmlSystemGetCudaDriverVersion())  # 12040 for CUDA 12.4
        cuda = f"{raw // 1000}.{raw % 1000 // 10}"
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        return NvmlFacts(None, driver, cuda, _topology(nvml, handles))
    except nvml.NVMLError as exc:
        return NvmlFacts(f"NVML: {exc}")
    finally:
        nvml.nvmlShutdown()


def _topology(nvml: Any, handles: list[Any]) -> Topology:
    n = len(handles)
    levels: dict[tuple[int, int], str] = {}
    for i in range(n):
        for j in range(i + 1, n):
            try:
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                levels[(i, j)] = NVML_TOPOLOGY_LABELS.get(level, "?")
            except nvml.NVMLError:
                levels[(i, j)] = "?"
    bus_to_index = {bus_id(nvml.nvmlDeviceGetPciInfo(h).busId): i for i, h in enumerate(handles)}
    direct = [[0] * n for _ in range(n)]
    to_switch = [0] * n
    for i, h in enumerate(handles):
        for remote_bus, is_switch in nvlink_remotes(nvml, h):
            if is_switch:
                to_switch[i] += 1
                continue
            peer = bus_to_index.get(remote_bus)
            if peer is not None and peer != i:
                direct[i][peer] += 1
    nvlinks: dict[tuple[int, int], int] = {}
    for i in range(n):
        for j in range(i + 1, n):
            # through an NVSwitch every pair is connected by the links both GPUs have to it
            via_switch = min(to_switch[i], to_switch[j])
            nvlinks[(i, j)] = max(direct[i][j], direct[j][i]) + via_switch
    return Topology(tuple(range(n)), levels, nvlinks)


@dataclass(frozen=True)
class TorchFacts:
    version: str
    cuda: str | None
    cuda_available: bool
    nccl: str | None
    nccl_available: bool
    gloo_available: bool
    device_bf16: Mapping[str, bool]  # NVML-style device name -> compute capability >= 8.0


def torch_facts() -> TorchFacts:
    import torch
    import torch.distributed as dist

    has_dist = dist.is_available()
    cuda_available = bool(torch.cuda.is_available())
    nccl_available = has_dist and dist.is_nccl_available()
    nccl = None
    bf16: dict[str, bool] = {}
    if cuda_available:
        try:
            nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
        except (RuntimeError, AttributeError):
            nccl = None
        for i in range(torch.cuda.device_count()):
            # torch.cuda.is_bf16_supported(including_emulation=False) asks the same of one device
            props = torch.cuda.get_device_properties(i)
            bf16[props.name] = bf16.get(props.name, True) and props.major >= 8
    return TorchFacts(torch.__version__, torch.version.cuda, cuda_available, nccl, nccl_available,
                      has_dist and dist.is_gloo_available(), bf16)


def gpu_type_facts(target: Target, visible: tuple[Device, ...],
                   device_bf16: Mapping[str, bool]) -> tuple[GpuTypeFacts, ...]:
    """BF16 by the catalog and by the device, for each GPU type among the target's devices."""
    if target.on_cpu:
        return ()
    by_type: dict[str, bool] = {}  # keyed like Device.gpu: catalog name, else "unknown:<name>"
    for device_name, ok in device_bf16.items():
        found = catalog.gpu_from_nvml_name(device_name)
        key = found.name if found else f"unknown:{device_name}"
        by_type[key] = by_type.get(key, True) and ok
    by_id = {d.id: d for d in visible}
    out: dict[str, GpuTypeFacts] = {}
    for d in target.devices:
        name = by_id[d.id].gpu if d.id in by_id else d.gpu
        known = catalog.gpu_types().get(name)
        out[name] = GpuTypeFacts(name.removeprefix("unknown:"), known.bf16 if known else None,
                                 by_type.get(name))
    return tuple(out.values())


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def shm_facts(path: str = "/dev/shm") -> Shm | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return Shm(path, st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail)


def disk_facts() -> Disk:
    """Free space under $GPUFLEET_HOME, where job folders and local checkpoints go."""
    from gpufleet.store import gpufleet_home

    try:
        home = gpufleet_home()
    except GpufleetError as exc:
        wanted = os.environ.get("GPUFLEET_HOME") or str(Path.home() / ".gpufleet")
        return Disk(wanted, None, str(exc))
    return Disk(str(home), shutil.disk_usage(home).free)


def interfaces() -> frozenset[str]:
    import psutil

    return frozenset(psutil.net_if_addrs())


def job_env(target: Target, base: Mapping[str, str], host_cpus: int) -> dict[str, str]:
    """The environment a job on the target's devices gets: gpufleet's presets under the
    caller's own settings, as `gpufleet run` and `gpufleet exec` build it."""
    placement = Placement(target.node, "127.0.0.1", target.devices)
    preset = device_env(placement, target.network, host_cpus)
    if target.cluster:
        preset["GPUFLEET_CLUSTER"] = target.cluster
    return merge_env(dict(base), preset, {})


def gather(target: Target, node: Node, nvml: NvmlFacts) -> NodeFacts:
    """Everything the checks need about `node` (this host), the all-reduce included."""
    host_cpus = os.cpu_count() or 1
    tf = torch_facts()
    env = job_env(target, os.environ, host_cpus)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    return NodeFacts(
        target=target, visible=node.devices, nvml_error=nvml.error, cpu_count=host_cpus,
        versions=Versions(nvml.driver, nvml.cuda_driver, tf.version, tf.cuda, tf.cuda_available,
                          tf.nccl, tf.nccl_available, tf.gloo_available),
        gpu_types=gpu_type_facts(target, node.devices, tf.device_bf16),
        cpu_flags=cpu_flags(), topology=nvml.topology, env=env, interfaces=interfaces(),
        shm=shm_facts(),
        nofile_soft=2**63 - 1 if soft == infinity else soft,
        nofile_hard=2**63 - 1 if hard == infinity else hard,
        disk=disk_facts(), allreduce=allreduce.run(len(target.devices), env),
        state=state_facts(home_path() / "state.db"),
    )
