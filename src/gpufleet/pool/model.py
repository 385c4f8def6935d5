"""What a backend discovers: nodes and their devices. Plain frozen data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

# Intra-node fabrics from weakest to strongest: a request is met by its level or a higher one.
FABRIC_LEVEL = {"pcie": 0, "nvlink": 1, "nvswitch": 2}


@dataclass(frozen=True)
class Device:
    id: str  # unique within its node: "gpu0", "cpu3"
    index: int  # CUDA device index, or the CPU slot number
    gpu: str  # catalog type name ("H100-SXM", "cpu")
    memory_bytes: int
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs this one reaches over NVLink
    healthy: bool = True
    simulated: bool = False
    busy: bool = False  # the engine has given it to work outside gpufleet (another Slurm job)


@dataclass(frozen=True)
class Node:
    id: str
    address: str
    devices: tuple[Device, ...]
    gpu_fabric: str = "pcie"  # how this node's GPUs reach each other: pcie, nvlink or nvswitch
    inter_fabric: str | None = None  # infiniband / ethernet to other nodes; None for a lone host
    free_disk_bytes: int = 0
    healthy: bool = True
    ref: str = ""  # the backend's own name for the node (a Ray node id), for pinning work to it
    state: str = ""  # the engine's own word for the node (Slurm: idle, mixed, allocated, down)

    def fabric_for(self, gpu: str) -> str:
        """CPU slots exchange data through host memory, which we file under pcie (the baseline)."""
        return "pcie" if gpu == "cpu" else self.gpu_fabric


@dataclass(frozen=True)
class Placement:
    node_id: str
    address: str
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class Allocation:
    placements: tuple[Placement, ...]

    @property
    def device_count(self) -> int:
        return sum(len(p.devices) for p in self.placements)
