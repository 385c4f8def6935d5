"""Pick devices for a cluster: homogeneous, topology-aware, gang (all or nothing), and explaining
every refusal.

Pure: it takes the inventory and the current reservations and returns an Allocation or raises
AllocationError with what was asked and what is free, so a user knows what to change.

The rules, in the order they decide:
- one GPU type and one fabric: every node of a cluster has the same intra-node fabric and, across
  nodes, the same inter-node network;
- a cluster on several nodes takes whole nodes that no other cluster uses, and keeps them to
  itself (a node's devices are never split between a multi-node job and anything else: its NCCL
  traffic and its failures stay its own);
- a one-node cluster is packed best fit: the node left with the fewest free devices, so 8-GPU
  requests still find whole 8-GPU nodes later;
- the cheapest group of nodes first (by `price(gpu, fabric)`), then the fewest nodes when the
  request leaves the node count open.

`Allocator` keeps an index of free devices per group of alike nodes, so one request costs a few
dictionary looks, not a scan of the pool (bench/allocator.py measures it on 16,000 GPUs).
`allocate()` is the one-shot form the CLI uses.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.errors import AllocationError
from gpufleet.pool.model import FABRIC_LEVEL, Allocation, Device, Node, Placement

# (node id, device id) -> name of the cluster holding it
Reservations = Mapping[tuple[str, str], str]
MAX_PER_NODE = 8
_LISTED_REASONS = 8  # per-node reasons named in a refusal; the rest are counted


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


def node_counts(count: int, nodes: int | None, max_per_node: int = MAX_PER_NODE) -> list[int]:
    """Node counts to try, fewest first: the one asked for, or every count that splits `count`
    evenly with at most `max_per_node` devices on each node."""
    if nodes is not None:
        return [nodes]
    return [n for n in range(1, count + 1) if count % n == 0 and count // n <= max_per_node]


@dataclass
class _NodeState:
    node: Node
    gpu: str
    free: list[Device]  # healthy, unreserved devices of the node's type, lowest index first
    total: int  # healthy devices of that type
    holders: set[str] = field(default_factory=set)  # clusters holding devices here
    exclusive: str | None = None  # the multi-node cluster that owns the whole node


GroupKey = tuple[str, str, str | None]  # (gpu, intra-node fabric, inter-node network)


class Allocator:
    """An index of the pool for fast, repeated allocation (the simulated 16k-GPU pool, and a
    service holding the inventory in memory). `take()` records an allocation, `release()` frees
    a cluster's devices; `allocate()` only looks."""

    def __init__(self, nodes: Iterable[Node], reserved: Reservations | None = None,
                 exclusive: Mapping[str, str] | None = None,
                 price: Callable[[str, str], float] | None = None):
        self.nodes: dict[str, Node] = {}
        self.state: dict[tuple[str, str], _NodeState] = {}  # (node, gpu) -> state
        # group -> free count -> node ids (a dict as an ordered set), one-node candidates
        self.buckets: dict[GroupKey, dict[int, dict[str, None]]] = {}
        # group -> devices per node -> untouched node ids, multi-node candidates
        self.whole: dict[GroupKey, dict[int, dict[str, None]]] = {}
        self.held: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {}  # cluster -> takes
        self.kinds: dict[str, list[str]] = {}  # node -> its GPU types
        self.price = price or (lambda _gpu, _fabric: 0.0)
        self._devices: dict[tuple[str, str], str] | None = None  # (node, device) -> type, for sync
        reserved = reserved or {}
        exclusive = exclusive or {}
        by_node: dict[str, list[tuple[str, str]]] = {}
        for (nid, did), holder in reserved.items():
            by_node.setdefault(nid, []).append((did, holder))
        for node in sorted(nodes, key=lambda n: n.id):
            self.nodes[node.id] = node
            self.kinds[node.id] = sorted({d.gpu for d in node.devices})
            for gpu in self.kinds[node.id]:
                healthy = [d for d in node.devices if d.gpu == gpu and d.healthy]
                taken = {did for did, _ in by_node.get(node.id, ())}
                st = _NodeState(node, gpu, sorted((d for d in healthy if d.id not in taken),
                                                  key=lambda d: d.index), len(healthy),
                                {h for _, h in by_node.get(node.id, ())},
                                exclusive.get(node.id))
                self.state[(node.id, gpu)] = st
                self._index(st)

    # -- index upkeep -----------------------------------------------------------------------------
    @staticmethod
    def _group(st: _NodeState) -> GroupKey:
        return (st.gpu, st.node.fabric_for(st.gpu), st.node.inter_fabric)

    def _index(self, st: _NodeState) -> None:
        if not st.node.healthy or st.exclusive is not None or not st.free:
            return
        key = self._group(st)
        self.buckets.setdefault(key, {}).setdefault(len(st.free), {})[st.node.id] = None
        if not st.holders and len(st.free) == st.total:
            self.whole.setdefault(key, {}).setdefault(st.total, {})[st.node.id] = None

    def _unindex(self, st: _NodeState) -> None:
        key = self._group(st)
        self.buckets.get(key, {}).get(len(st.free), {}).pop(st.node.id, None)
        self.whole.get(key, {}).get(st.total, {}).pop(st.node.id, None)

    # -- the questions --------------------------------------------------------------------------
    def _groups(self, gpu: str, network: str | None, multi: bool) -> list[GroupKey]:
        """Groups that meet the network, cheapest first."""
        out = []
        for key in set(self.buckets) | set(self.whole):
            g, fabric, inter = key
            if g != gpu:
                continue
            if network in FABRIC_LEVEL and FABRIC_LEVEL[fabric] < FABRIC_LEVEL[network]:
                continue
            if network is not None and network not in FABRIC_LEVEL and inter != network:
                continue
            if multi and inter is None:
                continue  # a lone host reaches no other node
            out.append(key)
        return sorted(out, key=lambda k: (self.price(gpu, k[2] if multi and k[2] else k[1]),
                                          -FABRIC_LEVEL[k[1]], str(k[2])))

    def _one_node(self, key: GroupKey, per: int, network: str | None) -> Placement | None:
        buckets = self.buckets.get(key, {})
        for f in range(per, max(buckets, default=0) + 1):  # best fit: fewest left over
            for nid in buckets.get(f, {}):
                st = self.state[(nid, key[0])]
                picked: list[Device] | None = st.free[:per]
                if network == "nvlink" and key[1] == "nvlink" and per > 1:
                    picked = _nvlink_clique(st.free, per)
                if picked is not None:
                    return Placement(nid, st.node.address, tuple(picked))
        return None

    def _many_nodes(self, key: GroupKey, n: int, per: int) -> list[Placement] | None:
        whole = self.whole.get(key, {})
        chosen: list[Placement] = []
        for size in range(per, max(whole, default=0) + 1):  # nodes of exactly `per` first
            for nid in whole.get(size, {}):
                st = self.state[(nid, key[0])]
                chosen.append(Placement(nid, st.node.address, tuple(st.free[:per])))
                if len(chosen) == n:
                    return chosen
        return None

    def allocate(self, gpu: str, count: int, nodes: int | None, network: str | None,
                 whole: bool = False) -> Allocation:
        """Devices for `count` x `gpu` over `nodes` nodes (None: the fewest that work), or
        AllocationError naming what was asked, what is free and why each candidate fell out.
        `whole`: untouched nodes even for one (a replacement node of a multi-node cluster)."""
        counts = node_counts(count, nodes)
        for n in counts:
            per = count // n
            for key in self._groups(gpu, network, n > 1 or whole):
                if n == 1 and not whole:
                    one = self._one_node(key, per, network)
                    if one is not None:
                        return Allocation((one,))
                else:
                    many = self._many_nodes(key, n, per)
                    if many is not None:
                        return Allocation(tuple(many))
        raise AllocationError(self._refusal(gpu, count, counts, network, whole))

    def take(self, holder: str, alloc: Allocation, whole: bool | None = None) -> None:
        """Record `alloc` as held by `holder`; several nodes (or `whole`) make the nodes its
        alone (every GPU type on them). A holder is one of a node's holders for every type
        there, as the constructor counts them, so no multi-node cluster of another type takes
        the node as untouched."""
        multi = len(alloc.placements) > 1 if whole is None else whole
        for p in alloc.placements:
            gpu = p.devices[0].gpu
            ids = {d.id for d in p.devices}
            for g in self.kinds[p.node_id]:
                st = self.state[(p.node_id, g)]
                self._unindex(st)
                if g == gpu:
                    st.free = [d for d in st.free if d.id not in ids]
                    self.held.setdefault(holder, []).append((p.node_id, gpu, tuple(sorted(ids))))
                st.holders.add(holder)
                if multi:
                    st.exclusive = holder
                self._index(st)

    def release(self, holder: str) -> None:
        """Give back what `take(holder, ...)` recorded in this allocator."""
        takes = self.held.pop(holder, [])
        back: dict[tuple[str, str], set[str]] = {}
        for nid, gpu, ids in takes:
            back.setdefault((nid, gpu), set()).update(ids)
        for nid in dict.fromkeys(t[0] for t in takes):  # in the order taken: ties stay put
            for g in self.kinds[nid]:
                st = self.state[(nid, g)]
                self._unindex(st)
                if st.exclusive == holder:
                    st.exclusive = None
                st.holders.discard(holder)
                given = back.get((nid, g), set())
                returned = [d for d in st.node.devices
                            if d.id in given and d.gpu == g and d.healthy]
                st.free = sorted(st.free + returned, key=lambda d: d.index)
                self._index(st)

    def sync(self, reserved: Reservations, exclusive: Mapping[str, str] | None = None) -> bool:
        """Hold exactly `reserved` and `exclusive`, as a new Allocator of the same nodes made
        with them would: the holders whose devices changed are released, the new ones taken.
        A service keeps one index between requests this way and pays for what changed since,
        not for the whole pool. False (nothing changed) when the reservations name a device
        the nodes do not have; build a new Allocator then."""
        exclusive = exclusive or {}
        if self._devices is None:
            self._devices = {(n.id, d.id): d.gpu for n in self.nodes.values() for d in n.devices}
        want: dict[str, dict[tuple[str, str], set[str]]] = {}  # holder -> (node, gpu) -> ids
        for key, holder in reserved.items():
            gpu = self._devices.get(key)
            if gpu is None:
                if key[0] in self.nodes:
                    return False
                continue  # not in this pool's nodes: the constructor ignores it too
            want.setdefault(holder, {}).setdefault((key[0], gpu), set()).add(key[1])
        if any(exclusive[nid] not in want or all(n != nid for n, _ in want[exclusive[nid]])
               for nid in exclusive if nid in self.nodes):
            return False  # a node held whole by a cluster holding nothing there
        whole = {h for nid, h in exclusive.items() if nid in self.nodes}
        for holder in list(self.held):
            have: dict[tuple[str, str], set[str]] = {}
            for nid, gpu, ids in self.held[holder]:
                have.setdefault((nid, gpu), set()).update(ids)
            was_whole = any(self.state[(nid, gpu)].exclusive == holder for nid, gpu in have)
            if have != want.get(holder) or was_whole != (holder in whole):
                self.release(holder)
        for holder, places in want.items():
            if holder in self.held:
                continue
            alloc = Allocation(tuple(
                Placement(nid, self.nodes[nid].address,
                          tuple(sorted((d for d in self.nodes[nid].devices if d.id in ids),
                                       key=lambda d: d.index)))
                for (nid, _gpu), ids in sorted(places.items())))
            self.take(holder, alloc, whole=holder in whole)
        return True

    # -- refusals -----------------------------------------------------------------------------
    def _reason(self, st: _NodeState, per: int, network: str | None, multi: bool) -> str | None:
        """Why one node cannot host its share, or None when it could."""
        node, gpu = st.node, st.gpu
        if not node.healthy:
            return f"node {node.id} is unhealthy"
        if network in FABRIC_LEVEL:
            have = node.fabric_for(gpu)
            if FABRIC_LEVEL[have] < FABRIC_LEVEL[network]:
                return f"node {node.id} connects its {gpu} devices over {have}, not {network}"
        elif network is not None and node.inter_fabric != network:
            return f"node {node.id} has no {network} to other nodes"
        if multi and node.inter_fabric is None:
            return f"node {node.id} has no network to other nodes"
        if st.exclusive is not None:
            return f"node {node.id} is held whole by cluster {st.exclusive}"
        if multi and st.holders:
            return (f"node {node.id} is partly held (by cluster {', '.join(sorted(st.holders))}); "
                    "a multi-node cluster takes whole nodes")
        if len(st.free) < per:
            why = f"node {node.id} has {len(st.free)} of {st.total} {gpu} free"
            if st.holders:
                why += f" (others held by cluster {', '.join(sorted(st.holders))})"
            return why
        if network == "nvlink" and node.fabric_for(gpu) == "nvlink" and per > 1 \
                and _nvlink_clique(st.free, per) is None:
            return f"node {node.id} has no {per} free {gpu} all linked by NVLink"
        return None

    def _refusal(self, gpu: str, count: int, counts: list[int], network: str | None,
                 whole: bool) -> str:
        mine = [st for (_, g), st in self.state.items() if g == gpu]
        free = sum(len(st.free) for st in mine if st.node.healthy and st.exclusive is None)
        if not counts:
            return (f"need {count} {gpu}: {count} cannot be split evenly over nodes of at most "
                    f"{MAX_PER_NODE} devices")
        n = counts[0]
        per = count // n
        shape = f"{per} on each of {n} node(s)" if len(counts) == 1 else \
            f"{per} on each of {n} node(s), or fewer per node on more nodes"
        head = f"need {count} {gpu} ({shape}), {free} free"
        if not mine:
            kinds = sorted({g for _, g in self.state})
            return f"{head}: the pool has no {gpu}; it has: {', '.join(kinds) or 'nothing'}"
        why_not: list[str] = []
        groups: dict[GroupKey, int] = {}  # nodes that could take their share, per group
        for st in mine:
            why = self._reason(st, per, network, n > 1 or whole)
            if why is None:
                groups[self._group(st)] = groups.get(self._group(st), 0) + 1
            else:
                why_not.append(why)
        listed = _summarized(why_not)
        if groups:  # nodes fit alone, but too few of one GPU type and one fabric together
            best = max(groups.values())
            listed.insert(0, f"at most {best} node(s) of one fabric could take {per}, fewer "
                          f"than the {n} needed")
        return f"{head}: {'; '.join(listed)}"


def _summarized(reasons: list[str]) -> list[str]:
    """Per-node reasons, the same reason for three nodes or more said once with its count, at
    most _LISTED_REASONS entries: a refusal on a 2,000-node pool stays one readable line."""
    by_text: dict[str, list[str]] = {}
    for why in reasons:
        _, node, text = why.split(" ", 2) if why.startswith("node ") else ("", "", why)
        by_text.setdefault(text, []).append(node)
    out: list[str] = []
    for text, nodes in by_text.items():
        if len(nodes) >= 3 and all(nodes):
            shown = ", ".join(nodes[:3]) + (", ..." if len(nodes) > 3 else "")
            out.append(f"{len(nodes)} nodes ({shown}): {text}")
        else:
            out += [f"node {nd} {text}" if nd else text for nd in nodes]
    if len(out) > _LISTED_REASONS:
        out = [*out[:_LISTED_REASONS], f"and {len(out) - _LISTED_REASONS} more"]
    return out


def allocate(gpu: str, count: int, nodes_wanted: int | None, network: str | None,
             nodes: list[Node], reserved: Reservations,
             exclusive: Mapping[str, str] | None = None,
             price: Callable[[str, str], float] | None = None, whole: bool = False) -> Allocation:
    """Place `count` devices of type `gpu` evenly over `nodes_wanted` nodes (None: the fewest
    nodes that can hold them)."""
    return Allocator(nodes, reserved, exclusive, price).allocate(gpu, count, nodes_wanted, network,
                                                                 whole)
