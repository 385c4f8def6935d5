"""The indexed `Allocator` over a pool of many nodes: whole-node exclusivity for multi-node clusters,
best-fit packing, fewest nodes, one group per cluster, price order, release, and the refusals.

test_allocate.py covers the one-shot rules on a node or two; these tests follow the allocator's
state across `take` and `release`, which is where a device handed out twice would come from.
"""

from __future__ import annotations

import random

import pytest

from gpufleet.errors import AllocationError
from gpufleet.pool.allocate import Allocator, _summarized, allocate, node_counts
from gpufleet.pool.model import Allocation, Device, Node

GPU = "H100-SXM"
GIB80 = 80 * 2**30


def devices(n: int, gpu: str = GPU, unhealthy: tuple[int, ...] = ()) -> tuple[Device, ...]:
    return tuple(Device(id=f"gpu{i}", index=i, gpu=gpu, memory_bytes=GIB80, healthy=i not in unhealthy)
                 for i in range(n))


def mk(node_id: str, n: int = 8, *, inter: str | None = "infiniband", fabric: str = "nvswitch",
       gpu: str = GPU, unhealthy: tuple[int, ...] = ()) -> Node:
    return Node(id=node_id, address=f"{node_id}.pool", devices=devices(n, gpu, unhealthy),
                gpu_fabric=fabric, inter_fabric=inter)


def layout(alloc: Allocation) -> list[tuple[str, int]]:
    return [(p.node_id, len(p.devices)) for p in alloc.placements]


def node_ids(alloc: Allocation) -> set[str]:
    return {p.node_id for p in alloc.placements}


def refused(a: Allocator, *args: object, **kw: object) -> str:
    with pytest.raises(AllocationError) as info:
        a.allocate(*args, **kw)  # type: ignore[arg-type]
    return str(info.value)


# ---------------------------------------------------------------- multi-node exclusivity


def test_multi_node_cluster_owns_its_nodes_whole() -> None:
    a = Allocator([mk("n1"), mk("n2")])
    big = a.allocate(GPU, 8, 2, None)
    assert layout(big) == [("n1", 4), ("n2", 4)]
    a.take("big", big)
    # 4 devices are still free on each node, but they belong to "big" alone
    msg = refused(a, GPU, 1, 1, None)
    assert "0 free" in msg
    assert "node n1 is held whole by cluster big" in msg
    assert "node n2 is held whole by cluster big" in msg


def test_multi_node_request_skips_a_node_a_one_node_cluster_touched() -> None:
    a = Allocator([mk("n1"), mk("n2"), mk("n3")])
    small = a.allocate(GPU, 1, 1, None)
    a.take("small", small)
    touched = next(iter(node_ids(small)))
    big = a.allocate(GPU, 16, 2, None)
    assert touched not in node_ids(big)
    assert node_ids(big) == {"n1", "n2", "n3"} - {touched}


def test_multi_node_refused_when_nodes_are_partly_held() -> None:
    a = Allocator([mk("n1"), mk("n2")])
    a.take("small", a.allocate(GPU, 2, 1, None))
    msg = refused(a, GPU, 8, 2, None)
    assert "need 8 H100-SXM (4 on each of 2 node(s)), 14 free" in msg
    assert "node n1 is partly held (by cluster small); a multi-node cluster takes whole nodes" in msg
    assert "node n2" not in msg  # n2 could host its share; only n1 is named as a reason
    assert "at most 1 node(s) of one fabric could take 4, fewer than the 2 needed" in msg


def test_multi_node_refused_behind_another_multi_node_cluster() -> None:
    a = Allocator([mk("n1"), mk("n2"), mk("n3")])
    a.take("big", a.allocate(GPU, 4, 2, None))
    msg = refused(a, GPU, 4, 2, None)
    assert "is held whole by cluster big" in msg
    assert "at most 1 node(s) of one fabric could take 2" in msg


def test_exclusive_from_the_store_is_honoured() -> None:
    nodes = [mk("n1"), mk("n2")]
    reserved = {("n1", "gpu0"): "big", ("n1", "gpu1"): "big"}
    a = Allocator(nodes, reserved, exclusive={"n1": "big"})
    assert layout(a.allocate(GPU, 6, 1, None)) == [("n2", 6)]
    assert "node n1 is held whole by cluster big" in refused(a, GPU, 8, 2, None)
    # the one-shot form says the same
    with pytest.raises(AllocationError, match="held whole by cluster big"):
        allocate(GPU, 8, 2, None, nodes, reserved, {"n1": "big"})


# ---------------------------------------------------------------- best fit


def test_one_node_requests_fill_a_partly_used_node_first() -> None:
    a = Allocator([mk("n1"), mk("n2")], reserved={("n2", "gpu0"): "x", ("n2", "gpu1"): "x"})
    first = a.allocate(GPU, 2, 1, None)
    assert layout(first) == [("n2", 2)]  # n2 has 6 free, n1 8: n2 fits tighter despite its id
    a.take("c1", first)
    assert [d.id for d in first.placements[0].devices] == ["gpu2", "gpu3"]
    # an 8-GPU request still finds the untouched node
    assert layout(a.allocate(GPU, 8, 1, None)) == [("n1", 8)]


def test_packing_keeps_whole_nodes_for_later() -> None:
    a = Allocator([mk(f"n{i}") for i in range(4)])
    for k in range(8):  # eight 2-GPU clusters: two nodes' worth
        a.take(f"c{k}", a.allocate(GPU, 2, 1, None))
    used = {nid for takes in a.held.values() for nid, _, _ in takes}
    assert len(used) == 2
    big = a.allocate(GPU, 16, 2, None)
    assert node_ids(big).isdisjoint(used)


def test_best_fit_prefers_the_exact_fit() -> None:
    nodes = [mk("a", 8), mk("b", 4), mk("c", 2)]
    assert layout(allocate(GPU, 2, 1, None, nodes, {})) == [("c", 2)]
    assert layout(allocate(GPU, 3, 1, None, nodes, {})) == [("b", 3)]
    assert layout(allocate(GPU, 5, 1, None, nodes, {})) == [("a", 5)]


# ---------------------------------------------------------------- fewest nodes


@pytest.mark.parametrize(("per_node", "count", "want"), [
    (8, 16, [8, 8]),
    (2, 4, [2, 2]),
    (8, 8, [8]),
    (4, 12, [4, 4, 4]),
])
def test_open_node_count_picks_the_fewest_nodes(per_node: int, count: int, want: list[int]) -> None:
    nodes = [mk(f"n{i}", per_node) for i in range(6)]
    alloc = allocate(GPU, count, None, None, nodes, {})
    assert sorted(len(p.devices) for p in alloc.placements) == want
    assert alloc.device_count == count


def test_open_node_count_refusal_names_the_other_splits() -> None:
    a = Allocator([mk("n1"), mk("n2")], reserved={("n1", "gpu7"): "x", ("n2", "gpu7"): "x"})
    # no node has 8 free and neither is untouched: 8 over one node or several is refused
    msg = refused(a, GPU, 8, None, None)
    assert "8 on each of 1 node(s), or fewer per node on more nodes" in msg


def test_node_counts() -> None:
    assert node_counts(16, None) == [2, 4, 8, 16]
    assert node_counts(4, None) == [1, 2, 4]
    assert node_counts(7, None) == [1, 7]
    assert node_counts(9, None) == [3, 9]
    assert node_counts(12, 5) == [5]
    assert node_counts(17, None) == [17]
    assert node_counts(6, None, max_per_node=2) == [3, 6]


def test_uneven_split_is_refused_plainly() -> None:
    assert node_counts(0, None) == []
    msg = refused(Allocator([mk("n1")]), GPU, 0, None, None)
    assert "cannot be split evenly" in msg


# ---------------------------------------------------------------- one type, one fabric


def test_multi_node_never_mixes_inter_node_networks() -> None:
    a = Allocator([mk("ib1", inter="infiniband"), mk("eth1", inter="ethernet")])
    msg = refused(a, GPU, 16, 2, None)
    assert "16 free" in msg
    assert "of one fabric could take 8, fewer than the 2 needed" in msg
    a2 = Allocator([mk("ib1", inter="infiniband"), mk("eth1", inter="ethernet"),
                    mk("ib2", inter="infiniband")])
    assert node_ids(a2.allocate(GPU, 16, 2, None)) == {"ib1", "ib2"}


def test_multi_node_never_mixes_intra_node_fabrics() -> None:
    a = Allocator([mk("sw1", fabric="nvswitch"), mk("pc1", fabric="pcie")])
    assert "fewer than the 2 needed" in refused(a, GPU, 16, 2, None)
    a2 = Allocator([mk("sw1", fabric="nvswitch"), mk("pc1", fabric="pcie"), mk("pc2", fabric="pcie")])
    assert node_ids(a2.allocate(GPU, 16, 2, None)) == {"pc1", "pc2"}


def test_many_nodes_of_mixed_groups_stay_in_one_group() -> None:
    nodes = [mk(f"n{i:02d}", inter=("infiniband", "ethernet")[i % 2],
                fabric=("nvswitch", "pcie", "nvswitch")[i % 3]) for i in range(30)]
    by_id = {n.id: n for n in nodes}
    a = Allocator(nodes)
    for k in range(6):
        alloc = a.allocate(GPU, 16, 4, None)
        a.take(f"c{k}", alloc)
        groups = {(by_id[p.node_id].gpu_fabric, by_id[p.node_id].inter_fabric) for p in alloc.placements}
        assert len(groups) == 1


def test_multi_node_needs_a_network() -> None:
    a = Allocator([mk("h1", inter=None), mk("h2", inter=None)])
    msg = refused(a, GPU, 16, 2, None)
    assert "node h1 has no network to other nodes" in msg
    # a lone host still serves one-node clusters
    assert layout(a.allocate(GPU, 8, 1, None)) == [("h1", 8)]


def test_only_the_asked_type_across_nodes() -> None:
    a = Allocator([mk("a1", gpu="A100-80GB"), mk("h1"), mk("a2", gpu="A100-80GB")])
    alloc = a.allocate("A100-80GB", 16, 2, None)
    assert node_ids(alloc) == {"a1", "a2"}
    assert {d.gpu for p in alloc.placements for d in p.devices} == {"A100-80GB"}


# ---------------------------------------------------------------- price


def test_price_picks_the_cheaper_network_for_multi_node() -> None:
    nodes = [mk("eth1", inter="ethernet"), mk("eth2", inter="ethernet"),
             mk("ib1", inter="infiniband"), mk("ib2", inter="infiniband")]
    rates = {"ethernet": 1.0, "infiniband": 3.0}
    cheap_eth = allocate(GPU, 16, 2, None, nodes, {}, price=lambda _g, f: rates[f])
    assert node_ids(cheap_eth) == {"eth1", "eth2"}
    cheap_ib = allocate(GPU, 16, 2, None, nodes, {}, price=lambda _g, f: 4.0 - rates[f])
    assert node_ids(cheap_ib) == {"ib1", "ib2"}


def test_price_picks_the_cheaper_fabric_for_one_node() -> None:
    nodes = [mk("sw", fabric="nvswitch"), mk("pc", fabric="pcie")]
    rates = {"pcie": 1.0, "nvswitch": 2.0}
    assert layout(allocate(GPU, 8, 1, None, nodes, {}, price=lambda _g, f: rates[f])) == [("pc", 8)]
    assert layout(allocate(GPU, 8, 1, None, nodes, {}, price=lambda _g, f: 3.0 - rates[f])) == [("sw", 8)]
    # unpriced: the stronger fabric first
    assert layout(allocate(GPU, 8, 1, None, nodes, {})) == [("sw", 8)]


def test_price_is_asked_with_the_gpu_type() -> None:
    seen: set[tuple[str, str]] = set()

    def price(gpu: str, fabric: str) -> float:
        seen.add((gpu, fabric))
        return 0.0

    allocate(GPU, 16, 2, None, [mk("n1"), mk("n2", inter="ethernet"), mk("n3")], {}, price=price)
    assert seen == {(GPU, "infiniband"), (GPU, "ethernet")}


def test_cheaper_group_that_cannot_fit_falls_back_to_the_dearer() -> None:
    nodes = [mk("eth1", inter="ethernet"), mk("ib1", inter="infiniband"), mk("ib2", inter="infiniband")]
    rates = {"ethernet": 1.0, "infiniband": 3.0}
    alloc = allocate(GPU, 16, 2, None, nodes, {}, price=lambda _g, f: rates[f])
    assert node_ids(alloc) == {"ib1", "ib2"}


# ---------------------------------------------------------------- release


def test_release_returns_devices_and_ends_exclusivity() -> None:
    a = Allocator([mk("n1"), mk("n2")])
    big = a.allocate(GPU, 8, 2, None)
    a.take("big", big)
    refused(a, GPU, 1, 1, None)
    a.release("big")
    assert "big" not in a.held
    again = a.allocate(GPU, 8, 2, None)
    assert layout(again) == layout(big)
    assert [[d.id for d in p.devices] for p in again.placements] == \
        [[d.id for d in p.devices] for p in big.placements]
    assert layout(a.allocate(GPU, 8, 1, None)) == [("n1", 8)]


def test_release_of_a_one_node_cluster_makes_the_node_whole_again() -> None:
    a = Allocator([mk("n1"), mk("n2")])
    a.take("small", a.allocate(GPU, 3, 1, None))
    refused(a, GPU, 16, 2, None)
    a.release("small")
    assert a.allocate(GPU, 16, 2, None).device_count == 16


def test_release_keeps_other_holders_on_the_node() -> None:
    a = Allocator([mk("n1", 4)])
    a.take("x", a.allocate(GPU, 2, 1, None))
    a.take("y", a.allocate(GPU, 1, 1, None))
    a.release("x")
    assert [d.id for d in a.allocate(GPU, 3, 1, None).placements[0].devices] == ["gpu0", "gpu1", "gpu3"]
    assert "node n1 has 3 of 4 H100-SXM free (others held by cluster y)" in refused(a, GPU, 4, 1, None)


def test_release_of_an_unknown_holder_changes_nothing() -> None:
    a = Allocator([mk("n1", 2)])
    a.take("x", a.allocate(GPU, 2, 1, None))
    a.release("nobody")
    assert "0 free" in refused(a, GPU, 1, 1, None)


def test_allocate_only_looks() -> None:
    a = Allocator([mk("n1", 2)])
    first = a.allocate(GPU, 2, 1, None)
    assert a.allocate(GPU, 2, 1, None) == first
    assert a.held == {}


# ---------------------------------------------------------------- whole=True


def test_whole_takes_an_untouched_node_over_a_best_fit_one() -> None:
    a = Allocator([mk("n1"), mk("n2")], reserved={("n1", "gpu0"): "x"})
    assert layout(a.allocate(GPU, 4, 1, None)) == [("n1", 4)]
    assert layout(a.allocate(GPU, 4, 1, None, whole=True)) == [("n2", 4)]


def test_whole_refused_when_every_node_is_touched() -> None:
    a = Allocator([mk("n1"), mk("n2")], reserved={("n1", "gpu0"): "x", ("n2", "gpu5"): "y"})
    msg = refused(a, GPU, 4, 1, None, whole=True)
    assert "node n1 is partly held (by cluster x)" in msg
    assert "node n2 is partly held (by cluster y)" in msg


def test_whole_needs_a_network() -> None:
    a = Allocator([mk("h1", inter=None)])
    assert "node h1 has no network to other nodes" in refused(a, GPU, 8, 1, None, whole=True)


def test_whole_through_the_one_shot_form() -> None:
    nodes = [mk("n1"), mk("n2"), mk("n3")]
    reserved = {("n1", "gpu0"): "big", ("n2", "gpu0"): "solo"}
    got = allocate(GPU, 4, 1, "infiniband", nodes, reserved, {"n1": "big"}, whole=True)
    assert layout(got) == [("n3", 4)]


# ---------------------------------------------------------------- refusal text


def test_refusal_says_a_reason_shared_by_many_nodes_once_with_their_count() -> None:
    nodes = [mk(f"n{i:02d}", 2) for i in range(11)]
    msg = refused(Allocator(nodes), GPU, 4, 1, None)
    assert "22 free" in msg
    assert "11 nodes (n00, n01, n02, ...): has 2 of 2 H100-SXM free" in msg
    assert msg.count("has 2 of 2") == 1


def test_refusal_keeps_two_nodes_apart_and_caps_many_distinct_reasons() -> None:
    msg = refused(Allocator([mk("n1", 2), mk("n2", 2)]), GPU, 4, 1, None)
    assert "node n1 has 2 of 2" in msg and "node n2 has 2 of 2" in msg
    reasons = [f"node m{i} has {i} of 9 H100-SXM free" for i in range(10)]
    listed = _summarized(reasons)
    assert listed[:8] == reasons[:8] and listed[8:] == ["and 2 more"]


def test_refusal_for_unknown_type_names_what_there_is() -> None:
    msg = refused(Allocator([mk("n1"), mk("n2", gpu="RTX4090", fabric="pcie")]), "A100-80GB", 1, 1, None)
    assert "the pool has no A100-80GB; it has: H100-SXM, RTX4090" in msg


def test_unhealthy_devices_are_not_counted_as_free() -> None:
    a = Allocator([mk("n1", unhealthy=(0, 1))])
    assert "has 6 of 6 H100-SXM free" in refused(a, GPU, 8, 1, None)
    alloc = a.allocate(GPU, 6, 1, None)
    assert [d.id for d in alloc.placements[0].devices] == [f"gpu{i}" for i in range(2, 8)]


# ---------------------------------------------------------------- at scale


def test_two_thousand_nodes_never_hand_a_device_out_twice() -> None:
    rng = random.Random(20240611)
    sick = {(f"n{i:04d}", i % 8) for i in range(0, 2000, 97)}
    nodes = [Node(id=f"n{i:04d}", address=f"10.0.{i // 250}.{i % 250}",
                  devices=tuple(Device(id=f"gpu{k}", index=k, gpu=GPU, memory_bytes=GIB80,
                                       healthy=(f"n{i:04d}", k) not in sick) for k in range(8)),
                  gpu_fabric="nvswitch", inter_fabric="infiniband" if i < 1200 else "ethernet")
             for i in range(2000)]
    by_id = {n.id: n for n in nodes}
    a = Allocator(nodes)
    held: dict[tuple[str, str], str] = {}  # (node, device) -> cluster
    owner: dict[str, str] = {}  # node -> multi-node cluster holding it whole
    clusters: dict[str, Allocation] = {}
    refusals = 0

    def free_on(nid: str) -> int:
        return sum(1 for d in by_id[nid].devices if d.healthy and (nid, d.id) not in held)

    for step in range(2000):
        if clusters and rng.random() < 0.25:
            name = rng.choice(sorted(clusters))
            a.release(name)
            for p in clusters.pop(name).placements:
                if owner.get(p.node_id) == name:
                    del owner[p.node_id]
                for d in p.devices:
                    assert held.pop((p.node_id, d.id)) == name
        count, n = rng.choice([(1, 1), (2, 1), (3, 1), (4, 1), (8, 1), (5, 1),
                               (16, 2), (8, 2), (32, 4), (16, None), (24, None), (64, 8)])
        name = f"c{step}"
        try:
            alloc = a.allocate(GPU, count, n, None)
        except AllocationError:
            refusals += 1
            if n == 1:  # a refusal must be true: no node outside multi-node clusters has room
                assert all(free_on(nid) < count for nid in by_id
                           if nid not in owner), f"step {step}: {count} refused with room left"
            continue
        assert alloc.device_count == count
        assert len({len(p.devices) for p in alloc.placements}) == 1
        assert len(node_ids(alloc)) == len(alloc.placements)
        multi = len(alloc.placements) > 1
        nets = {by_id[p.node_id].inter_fabric for p in alloc.placements}
        assert len(nets) == 1
        for p in alloc.placements:
            assert p.node_id not in owner, f"step {step}: {p.node_id} is held whole by {owner[p.node_id]}"
            if multi:
                assert not any(nid == p.node_id for nid, _ in held), \
                    f"step {step}: multi-node cluster given partly held node {p.node_id}"
            for d in p.devices:
                assert d.healthy
                assert (p.node_id, d.id) not in held, f"step {step}: {p.node_id}/{d.id} handed out twice"
        a.take(name, alloc)
        clusters[name] = alloc
        for p in alloc.placements:
            if multi:
                owner[p.node_id] = name
            for d in p.devices:
                held[(p.node_id, d.id)] = name

    assert len(clusters) > 100
    assert 0 < refusals < 2000  # the pool filled up at some point, yet most requests were met
    for name in list(clusters):
        a.release(name)
    assert a.allocate(GPU, 64, 8, None).device_count == 64
    assert a.held == {}


# ---------------------------------------------------------------- known faults (see the report)


def test_a_mixed_node_held_by_a_multi_node_cluster_is_held_for_every_type() -> None:
    def mixed(nid: str) -> Node:
        return Node(id=nid, address=nid, gpu_fabric="nvswitch", inter_fabric="infiniband",
                    devices=devices(4) + tuple(Device(id=f"gpu{i}", index=i, gpu="A100-80GB",
                                                      memory_bytes=GIB80) for i in range(4, 8)))

    a = Allocator([mixed("n1"), mixed("n2")])
    a.take("big", a.allocate(GPU, 8, 2, None))
    assert "held whole by cluster big" in refused(a, "A100-80GB", 8, 2, None)


def test_refusal_for_mixed_fabrics_does_not_contradict_itself() -> None:
    a = Allocator([mk("ib1", inter="infiniband"), mk("eth1", inter="ethernet")])
    assert "2 node(s) could take 8, fewer than the 2 needed" not in refused(a, GPU, 16, 2, None)
