"""`Allocator.sync`: an index kept between requests and brought up to the store's reservations
must be the index a new `Allocator` of those reservations would be, or a device could be given
twice (a reservation it missed) or refused while free (one it kept)."""

from __future__ import annotations

import random

from gpufleet.errors import AllocationError
from gpufleet.pool.allocate import Allocator, Reservations
from gpufleet.pool.model import Device, Node

H100, RTX = "H100-SXM", "RTX4090"


def node(nid: str, gpus: tuple[tuple[str, int], ...] = ((H100, 8),), inter: str = "infiniband",
         unhealthy: tuple[int, ...] = ()) -> Node:
    devs, i = [], 0
    for gpu, n in gpus:
        for _ in range(n):
            devs.append(Device(id=f"gpu{i}", index=i, gpu=gpu, memory_bytes=1,
                               healthy=i not in unhealthy))
            i += 1
    return Node(id=nid, address=nid, devices=tuple(devs), gpu_fabric="nvswitch",
                inter_fabric=inter)


def view(a: Allocator) -> tuple[object, ...]:
    """What decides every answer: per node and type the free devices, holders and owner, and
    the candidate sets (order aside)."""
    states = {k: ([d.id for d in st.free], frozenset(st.holders), st.exclusive)
              for k, st in a.state.items()}
    buckets = {(g, f): frozenset(ids) for g, by in a.buckets.items() for f, ids in by.items()
               if ids}
    whole = {(g, f): frozenset(ids) for g, by in a.whole.items() for f, ids in by.items() if ids}
    return states, buckets, whole


def store_view(a: Allocator) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """The reservations and whole nodes a store would hold for what `a` has taken."""
    reserved: dict[tuple[str, str], str] = {}
    whole: dict[str, str] = {}
    for holder, takes in a.held.items():
        for nid, _gpu, ids in takes:
            for did in ids:
                reserved[(nid, did)] = holder
            if len({t[0] for t in takes}) > 1:
                whole[nid] = holder
    return reserved, whole


def pool() -> list[Node]:
    nodes = [node(f"a{i}") for i in range(6)]
    nodes += [node(f"m{i}", ((H100, 4), (RTX, 4))) for i in range(3)]  # two types on a node
    nodes += [node(f"e{i}", ((RTX, 8),), inter="ethernet") for i in range(3)]
    nodes.append(node("sick", unhealthy=(0, 3)))
    return nodes


def test_a_synced_index_is_the_index_built_from_scratch_through_random_churn() -> None:
    rng = random.Random(7)
    nodes = pool()
    truth = Allocator(nodes)  # what the store holds, moved by take and release
    kept = Allocator(nodes)  # the server's index, only ever synced
    live: list[str] = []
    for step in range(400):
        if live and (rng.random() < 0.45 or len(live) > 12):
            truth.release(live.pop(rng.randrange(len(live))))
        else:
            gpu = rng.choice([H100, RTX])
            count, n = rng.choice([(1, 1), (2, 1), (3, 1), (4, 1), (8, 1), (8, 2), (4, 2)])
            try:
                got = truth.allocate(gpu, count, n, None)
            except AllocationError:
                continue
            truth.take(f"c{step}", got)
            live.append(f"c{step}")
        if rng.random() < 0.5:  # the server syncs at some requests, not at every change
            continue
        reserved, whole = store_view(truth)
        assert kept.sync(reserved, whole)
        assert view(kept) == view(Allocator(nodes, reserved, whole)), step
        for gpu, count, n in ((H100, 8, 2), (RTX, 4, 1), (H100, 1, None)):
            try:
                a = kept.allocate(gpu, count, n, None)
            except AllocationError:
                continue
            held = set(reserved)
            assert not {(p.node_id, d.id) for p in a.placements for d in p.devices} & held


def test_sync_releases_a_cluster_gone_from_the_store_and_frees_its_nodes() -> None:
    nodes = [node("n1"), node("n2")]
    kept = Allocator(nodes)
    reserved: Reservations = {(n, f"gpu{i}"): "big" for n in ("n1", "n2") for i in range(8)}
    assert kept.sync(reserved, {"n1": "big", "n2": "big"})
    try:
        kept.allocate(H100, 1, 1, None)
        raise AssertionError("both nodes are held whole")
    except AllocationError as exc:
        assert "held whole by cluster big" in str(exc)
    assert kept.sync({}, {})
    assert len(kept.allocate(H100, 16, 2, None).placements) == 2
    assert kept.held == {}


def test_sync_refuses_a_device_the_nodes_do_not_have() -> None:
    kept = Allocator([node("n1")])
    assert kept.sync({("n1", "gpu99"): "odd"}) is False
    assert kept.sync({("elsewhere", "gpu0"): "other"}) is True  # another pool's node: ignored
    assert view(kept) == view(Allocator([node("n1")]))


def test_a_holder_of_one_type_keeps_a_mixed_node_from_a_multi_node_cluster_of_another() -> None:
    nodes = [node("m1", ((H100, 4), (RTX, 4))), node("m2", ((H100, 4), (RTX, 4)))]
    a = Allocator(nodes)
    a.take("small", a.allocate(H100, 1, 1, None))
    try:
        got = a.allocate(RTX, 8, 2, None)
    except AllocationError:
        return
    raise AssertionError(f"a node shared with cluster small was given whole: {got}")
