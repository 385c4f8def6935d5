"""What the doctor knows about a node (facts, gathered by facts.py) and what it says about it
(`Check`), with the thresholds its verdicts use. Data only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpufleet.pool.model import Device

Status = Literal["pass", "warn", "fail"]

MIB = 2**20
GIB = 2**30

# /dev/shm, judged on free bytes. Docker gives containers 64 MiB by default
# (docs.docker.com/reference/cli/docker/container/run: --shm-size), which is not enough for
# DataLoader workers (they pass batches through it) nor for NCCL's shared-memory transport.
SHM_FAIL_BYTES = 128 * MIB
SHM_WARN_BYTES = 1 * GIB
# Open files (soft limit). Each DataLoader batch shared between processes holds a descriptor, and
# NCCL and gloo open sockets per peer: 1024, a common default, runs out with a few workers.
NOFILE_FAIL = 1024  # below this even a small job is likely to hit "Too many open files"
NOFILE_WARN = 65536
# Free space where job folders and local checkpoints are written ($GPUFLEET_HOME).
# A 1B-parameter model with Adam checkpoints to 12-14 GB (fp32 weights + 2 moments, bf16 copy).
DISK_FAIL_BYTES = 2 * GIB
DISK_WARN_BYTES = 20 * GIB

# nvmlDeviceGetTopologyCommonAncestor levels, labelled as `nvidia-smi topo -m` prints them
# (0, INTERNAL, is two GPUs on one board: shown as PIX).
NVML_TOPOLOGY_LABELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
TOPOLOGY_MEANING = {
    "PIX": "at most one PCIe bridge", "PXB": "several PCIe bridges",
    "PHB": "a PCIe host bridge (the CPU)", "NODE": "host bridges within a NUMA node",
    "SYS": "the link between CPU sockets",
}
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
NCCL_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")

# The all-reduce worker prints one line starting with this; the parent finds it in torchrun's output.
RESULT_MARKER = "GPUFLEET_DOCTOR_ALLREDUCE "


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""  # empty when the check passes
    data: Mapping[str, Any] = field(default_factory=dict)  # numbers and matrices for --json

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix,
                "data": dict(self.data)}


# -- facts -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What doctor validates on one node: a cluster's devices there, or what it picked itself."""

    node: str
    cluster: str | None  # None: no --cluster, the devices are this host's GPUs or 2 CPU workers
    gpu: str  # catalog type name, "cpu" for CPU slots
    network: str  # the cluster's declared network, or the fabric found
    devices: tuple[Device, ...]

    @property
    def on_cpu(self) -> bool:
        return self.gpu == "cpu"


@dataclass(frozen=True)
class Versions:
    driver: str | None  # NVIDIA driver, e.g. "550.54.15"; None without NVML
    cuda_driver: str | None  # newest CUDA the driver supports, "12.4"
    torch: str
    torch_cuda: str | None  # CUDA runtime torch was built with; None for a CPU build
    cuda_available: bool
    nccl: str | None  # NCCL bundled with torch, when CUDA is available
    nccl_available: bool
    gloo_available: bool


@dataclass(frozen=True)
class GpuTypeFacts:
    """BF16 support of one GPU type on this node, by the catalog and by the device itself."""

    name: str  # catalog type, or NVML's name when the catalog does not know it
    catalog_bf16: bool | None  # None: not in the catalog
    device_bf16: bool | None  # compute capability >= 8.0 (torch's test); None without CUDA


@dataclass(frozen=True)
class Topology:
    """Pairwise links between this node's GPUs (NVML indices), as `nvidia-smi topo -m` shows."""

    indices: tuple[int, ...]
    levels: Mapping[tuple[int, int], str]  # (i, j) with i < j -> "PIX" ... "SYS"
    nvlinks: Mapping[tuple[int, int], int]  # (i, j) with i < j -> NVLinks between them (0: none)

    def link(self, i: int, j: int) -> str:
        if i == j:
            return "X"
        key = (min(i, j), max(i, j))
        links = self.nvlinks.get(key, 0)
        return f"NV{links}" if links else self.levels.get(key, "?")


@dataclass(frozen=True)
class Shm:
    path: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Disk:
    path: str
    free_bytes: int | None
    error: str | None = None  # why the folder could not be used


@dataclass(frozen=True)
class AllReduceRun:
    """What torchrun did: exit code (None when killed at the timeout) and its output lines."""

    workers: int
    backend: str  # "gloo" or "nccl"
    returncode: int | None
    timed_out: bool
    timeout_s: float
    output: tuple[str, ...]


@dataclass(frozen=True)
class StateFacts:
    """The state file as `doctor.state_check.state_facts` found it (the verdict is made there)."""

    path: str
    exists: bool
    open_problem: str | None  # state_file.open_problem's line, when the file may not be opened
    quick_check: tuple[str, ...] = ()  # PRAGMA quick_check's rows: ("ok",) when intact
    error: str | None = None  # why SQLite could not read it at all


@dataclass(frozen=True)
class NodeFacts:
    target: Target
    visible: tuple[Device, ...]  # what the backend sees now: GPUs, then CPU slots
    nvml_error: str | None  # why NVML gave no answer (no driver, no pynvml); None when it did
    cpu_count: int
    versions: Versions
    gpu_types: tuple[GpuTypeFacts, ...]
    cpu_flags: frozenset[str]
    topology: Topology | None
    env: Mapping[str, str]  # the environment a job on the target would get
    interfaces: frozenset[str]
    shm: Shm | None
    nofile_soft: int
    nofile_hard: int
    disk: Disk
    allreduce: AllReduceRun
    state: StateFacts | None = None  # the state file; None: not looked at
