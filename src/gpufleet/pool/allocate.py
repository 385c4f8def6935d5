"""Pick devices for a cluster: homogeneous, topology-aware, and explaining every refusal.

Pure: it takes the inventory and the current reservations and returns an Allocation or raises
AllocationError with what was asked and what is free, so a user knows what to change.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from gpufleet.errors import AllocationError
from gpufleet.pool.model import FABRIC_LEVEL, Allocation, Device, Node, Placement

# (node id, device id) -> name of the cluster holding it
Reservations = Mapping[tuple[str, str], str]


def free_devices(node: Node, gpu: str, reserved: Reservations) -> list[Device]:
    return [
        d for d in node.devices
        if d.gpu == gpu and d.healthy and (node.id, d.id) not in reserved
    ]


def _nvlink_clique(devices: list[Device], size: int) -> list[Device] | None:
    """`size` devices that all reach each other over NVLink, lowest indices first.

    An exhaustive search: a node has at most 8 GPUs, so at most C(8, 4) = 70 groups to try.
    """
    for group in itertools.combinations(devices, size):
        if all(b.index in a.nvlink_peers for a, b in itertools.combinations(group, 2)):
            return list(group)
    return None


def _pick_on_node(node: Node, gpu: str, per_node: int, network: str,
                  reserved: Reservations) -> tuple[list[Device] | None, str]:
    """Devices on one node, or None with the reason this node cannot host its share."""
    if not node.healthy:
        return None, f"node {node.id} is unhealthy"
    if network in FABRIC_LEVEL:
        have = node.fabric_for(gpu)
        if FABRIC_LEVEL[have] < FABRIC_LEVEL[network]:
            return None, f"node {node.id} connects its {gpu} devices over {have}, not {network}"
    elif node.inter_fabric != network:
        return None, f"node {node.id} has no {network} to other nodes"
    free = free_devices(node, gpu, reserved)
    if len(free) < per_node:
        held = sorted({c for (n, _), c in reserved.items() if n == node.id})
        total = sum(1 for d in node.devices if d.gpu == gpu)
        why = f"node {node.id} has {len(free)} of {total} {gpu} free"
        if held:
            why += f" (others held by cluster {', '.join(held)})"
        return None, why
    if network == "nvlink" and node.fabric_for(gpu) == "nvlink" and per_node > 1:
        clique = _nvlink_clique(free, per_node)
        if clique is None:
            return None, f"node {node.id} has no {per_node} free {gpu} all linked by NVLink"
        return clique, ""
    return free[:per_node], ""


def allocate(gpu: str, count: int, nodes_wanted: int, network: str, nodes: list[Node],
             reserved: Reservations) -> Allocation:
    """Place `count` devices of type `gpu` evenly over `nodes_wanted` nodes.

    Nodes that would be left with the fewest free devices are filled first (best fit), so large
    requests still find whole nodes later.
    """
    per_node = count // nodes_wanted
    candidates: list[tuple[int, str, Node, list[Device]]] = []
    reasons: list[str] = []
    for node in nodes:
        if not any(d.gpu == gpu for d in node.devices):
            continue
        picked, why = _pick_on_node(node, gpu, per_node, network, reserved)
        if picked is None:
            reasons.append(why)
            continue
        spare = len(free_devices(node, gpu, reserved)) - per_node
        candidates.append((spare, node.id, node, picked))
    if len(candidates) < nodes_wanted:
        total_free = sum(len(free_devices(n, gpu, reserved)) for n in nodes)
        head = f"need {count} {gpu} ({per_node} on each of {nodes_wanted} node(s)), {total_free} free"
        if not reasons:
            kinds = sorted({d.gpu for n in nodes for d in n.devices})
            reasons.append(f"the pool has no {gpu}; it has: {', '.join(kinds) or 'nothing'}")
        raise AllocationError(f"{head}: {'; '.join(reasons)}")
    candidates.sort(key=lambda c: (c[0], c[1]))
    return Allocation(tuple(
        Placement(node.id, node.address, tuple(picked))
        for _, _, node, picked in candidates[:nodes_wanted]
    ))
