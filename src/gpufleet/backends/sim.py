"""Synthetic pools: nodes of any number and mix, for planning and scale tests.

A shape is `NODESxGPU:PER_NODE[:NETWORK]`, e.g. `1000xH100:8:infiniband` or `400xRTX4090:4`
(network defaults to infiniband). Each node's intra-node fabric is the one the catalog gives its
GPU type (NVSwitch for H100 SXM boards, PCIe for RTX cards). Every device is simulated: the pool
only discovers, so clusters carved from it are reservations for planning, never billed and never
run (a job needs a local or Ray pool).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet import catalog
from gpufleet.backends.base import Handle, Prepared, RunRequest
from gpufleet.backends.kinds import CAPABILITIES, Capabilities, Kind
from gpufleet.errors import ConflictError, SpecError
from gpufleet.pool.model import Device, Node
from gpufleet.vocab import IN_NODE_NETWORKS, INTER_NODE_NETWORKS

NETWORKS = INTER_NODE_NETWORKS
MAX_NODES = 100_000
_SHAPE = re.compile(r"^\s*(\d+)\s*x\s*([A-Za-z0-9._-]+)\s*:\s*(\d+)\s*(?::\s*([a-z]+))?\s*$")


@dataclass(frozen=True)
class Shape:
    nodes: int
    gpu: str  # catalog name
    per_node: int
    network: str

    def text(self) -> str:
        return f"{self.nodes}x{self.gpu}:{self.per_node}:{self.network}"


def parse_shape(text: str) -> Shape:
    m = _SHAPE.match(text)
    if not m:
        raise SpecError([("shape", f"'{text}' is not a shape; use NODESxGPU:PER_NODE[:NETWORK], "
                          "e.g. 1000xH100:8:infiniband")])
    nodes, gpu_name, per, network = int(m[1]), m[2], int(m[3]), m[4] or "infiniband"
    gpu = catalog.resolve_gpu(gpu_name, field="shape")
    if not 1 <= nodes <= MAX_NODES:
        raise SpecError([("shape", f"'{text}': {nodes} nodes; must be 1 to {MAX_NODES}")])
    if not 1 <= per <= 8:
        raise SpecError([("shape", f"'{text}': {per} devices per node; must be 1 to 8")])
    if network not in NETWORKS:
        raise SpecError([("shape", f"'{text}': network '{network}' is not allowed; allowed: "
                          f"{', '.join(NETWORKS)}")])
    return Shape(nodes, gpu.name, per, network)


def parse_shapes(texts: list[str]) -> list[Shape]:
    if not texts:
        raise SpecError([("shape", "give at least one --shape NODESxGPU:PER_NODE[:NETWORK], "
                          "e.g. --shape 1000xH100:8")])
    shapes = [parse_shape(t) for t in texts]
    total = sum(s.nodes for s in shapes)
    if total > MAX_NODES:
        raise SpecError([("shape", f"{total} nodes in all; at most {MAX_NODES}")])
    return shapes


def build_nodes(pool: str, shapes: list[Shape]) -> list[Node]:
    """The pool's nodes, named `<pool>-<gpu>-<n>`: the same names every time, so reservations
    stay valid from one command to the next."""
    nodes: list[Node] = []
    for s in shapes:
        gpu = catalog.gpu_types()[s.gpu]
        fabric = gpu.node_fabric if gpu.node_fabric in IN_NODE_NETWORKS else "pcie"
        mem = int(gpu.memory_gb * 1e9)
        peers_all = tuple(range(s.per_node))
        devices = tuple(
            Device(id=f"gpu{i}", index=i, gpu=s.gpu, memory_bytes=mem, simulated=True,
                   nvlink_peers=tuple(p for p in peers_all if p != i) if fabric != "pcie" else ())
            for i in range(s.per_node))
        tag = s.gpu.lower()
        start = sum(1 for n in nodes if n.devices[0].gpu == s.gpu)
        for k in range(s.nodes):
            nid = f"{pool}-{tag}-{start + k}"
            nodes.append(Node(id=nid, address=nid, devices=devices, gpu_fabric=fabric,
                              inter_fabric=s.network))
    return nodes


RUNS_NOTHING = "a simulated pool only plans and reserves; a job needs a local or Ray pool"


class SimBackend:
    """Discovers declared nodes; every process-side call refuses, since nothing runs here."""

    kind: Kind = "sim"
    name = "sim"
    capabilities: Capabilities = CAPABILITIES["sim"]
    pids_here = False

    def __init__(self, pool: str, shapes: list[Shape]):
        self.pool, self.shapes = pool, shapes
        self._nodes: list[Node] | None = None

    def discover(self) -> list[Node]:
        if self._nodes is None:
            self._nodes = build_nodes(self.pool, self.shapes)
        return self._nodes

    def prepare(self, run: RunRequest) -> Prepared:
        raise ConflictError(f"cluster {run.cluster_name}: {RUNS_NOTHING}")

    def start(self, prepared: Prepared, env: dict[str, str], cwd: Path) -> Handle:
        raise ConflictError(RUNS_NOTHING)

    def poll(self, handle: Handle) -> int | None:
        raise ConflictError(RUNS_NOTHING)

    def signal(self, handle: Handle, sig: int) -> None:
        raise ConflictError(RUNS_NOTHING)

    def kill_tree(self, handle: Handle, grace_s: float = 10.0) -> None:
        raise ConflictError(RUNS_NOTHING)

    def lost_nodes(self, job_dir: Path) -> set[str]:
        return set()

    def adopt_orphans(self) -> None:
        pass

    def end_orphans(self) -> None:
        pass

    def node_lost(self, code: int, lines: list[str]) -> str | None:
        return None

    def report_host(self) -> str:
        return "127.0.0.1"
