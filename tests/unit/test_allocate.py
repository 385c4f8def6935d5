"""The pure allocator: homogeneous, topology-aware, best fit, and every refusal explained."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from gpufleet.errors import AllocationError
from gpufleet.pool.allocate import allocate, free_devices
from gpufleet.pool.model import Allocation, Device, Node

GIB80 = 80 * 2**30


def gpus(n: int, gpu: str = "H100-SXM", *, peers: dict[int, Iterable[int]] | None = None,
         unhealthy: Iterable[int] = ()) -> tuple[Device, ...]:
    peers = peers or {}
    bad = set(unhealthy)
    return tuple(
        Device(id=f"gpu{i}", index=i, gpu=gpu, memory_bytes=GIB80,
               nvlink_peers=tuple(sorted(peers.get(i, ()))), healthy=i not in bad)
        for i in range(n)
    )


def node(node_id: str, devices: tuple[Device, ...], **kw: object) -> Node:
    return Node(id=node_id, address=f"{node_id}.local", devices=devices, **kw)  # type: ignore[arg-type]


def ids(alloc: Allocation) -> list[tuple[str, list[str]]]:
    return [(p.node_id, [d.id for d in p.devices]) for p in alloc.placements]


def refusal(*args: object) -> str:
    with pytest.raises(AllocationError) as info:
        allocate(*args)  # type: ignore[arg-type]
    return str(info.value)


# ---------------------------------------------------------------- single node


def test_picks_lowest_free_devices() -> None:
    n = node("n1", gpus(8))
    alloc = allocate("H100-SXM", 4, 1, "pcie", [n], {})
    assert ids(alloc) == [("n1", ["gpu0", "gpu1", "gpu2", "gpu3"])]
    assert alloc.device_count == 4
    assert alloc.placements[0].address == "n1.local"


def test_skips_reserved_devices() -> None:
    n = node("n1", gpus(8))
    reserved = {("n1", "gpu0"): "a", ("n1", "gpu2"): "b"}
    alloc = allocate("H100-SXM", 3, 1, "pcie", [n], reserved)
    assert ids(alloc) == [("n1", ["gpu1", "gpu3", "gpu4"])]


def test_reserved_devices_never_given_twice() -> None:
    n = node("n1", gpus(4))
    reserved: dict[tuple[str, str], str] = {}
    for name in ("a", "b"):
        for p in allocate("H100-SXM", 2, 1, "pcie", [n], reserved).placements:
            for d in p.devices:
                assert (p.node_id, d.id) not in reserved
                reserved[(p.node_id, d.id)] = name
    assert sorted(reserved) == [("n1", f"gpu{i}") for i in range(4)]
    # the pool is now full: a third request is refused, not handed a device already held
    msg = refusal("H100-SXM", 1, 1, "pcie", [n], reserved)
    assert "0 free" in msg


def test_a_reservation_on_another_node_does_not_block_the_same_device_id() -> None:
    n1, n2 = node("n1", gpus(1)), node("n2", gpus(1))
    alloc = allocate("H100-SXM", 1, 1, "pcie", [n1, n2], {("n1", "gpu0"): "a"})
    assert ids(alloc) == [("n2", ["gpu0"])]


def test_refusal_says_what_was_asked_what_is_free_and_who_holds_the_rest() -> None:
    n = node("n1", gpus(4))
    reserved = {("n1", "gpu0"): "llama", ("n1", "gpu1"): "llama", ("n1", "gpu2"): "bert"}
    msg = refusal("H100-SXM", 4, 1, "pcie", [n], reserved)
    assert "need 4 H100-SXM" in msg
    assert "1 free" in msg  # 4 devices - 3 reserved
    assert "has 1 of 4 H100-SXM free" in msg
    assert "held by cluster bert, llama" in msg


def test_unhealthy_devices_skipped() -> None:
    n = node("n1", gpus(4, unhealthy=[0, 2]))
    alloc = allocate("H100-SXM", 2, 1, "pcie", [n], {})
    assert ids(alloc) == [("n1", ["gpu1", "gpu3"])]
    assert [d.id for d in free_devices(n, "H100-SXM", {})] == ["gpu1", "gpu3"]
    assert "need 3 H100-SXM" in refusal("H100-SXM", 3, 1, "pcie", [n], {})


def test_unhealthy_node_skipped() -> None:
    sick = node("n1", gpus(8), healthy=False)
    well = node("n2", gpus(8))
    alloc = allocate("H100-SXM", 8, 1, "pcie", [sick, well], {})
    assert ids(alloc) == [("n2", [f"gpu{i}" for i in range(8)])]
    msg = refusal("H100-SXM", 8, 1, "pcie", [sick], {})
    assert "node n1 is unhealthy" in msg


def test_only_the_requested_type_is_given() -> None:
    n = node("n1", gpus(2, "A100-80GB") + tuple(
        Device(id=f"gpu{i}", index=i, gpu="H100-SXM", memory_bytes=GIB80) for i in (2, 3)))
    alloc = allocate("H100-SXM", 2, 1, "pcie", [n], {})
    assert ids(alloc) == [("n1", ["gpu2", "gpu3"])]
    assert {d.gpu for p in alloc.placements for d in p.devices} == {"H100-SXM"}


def test_pool_lacking_the_type_lists_what_it_has() -> None:
    nodes = [node("n1", gpus(2, "A100-80GB")), node("n2", gpus(2, "RTX4090"))]
    msg = refusal("H100-SXM", 1, 1, "pcie", nodes, {})
    assert "need 1 H100-SXM" in msg
    assert "0 free" in msg
    assert "the pool has no H100-SXM; it has: A100-80GB, RTX4090" in msg


def test_empty_pool_says_nothing() -> None:
    assert "it has: nothing" in refusal("H100-SXM", 1, 1, "pcie", [], {})


# ---------------------------------------------------------------- intra-node fabric


def test_nvswitch_request_refused_on_pcie_node() -> None:
    n = node("n1", gpus(8), gpu_fabric="pcie")
    msg = refusal("H100-SXM", 8, 1, "nvswitch", [n], {})
    assert "need 8 H100-SXM" in msg
    assert "node n1 connects its H100-SXM devices over pcie, not nvswitch" in msg


def test_nvswitch_request_met_on_nvswitch_node() -> None:
    n = node("n1", gpus(8), gpu_fabric="nvswitch")
    assert allocate("H100-SXM", 8, 1, "nvswitch", [n], {}).device_count == 8


def test_weaker_fabric_request_met_by_stronger_node() -> None:
    n = node("n1", gpus(8), gpu_fabric="nvswitch")
    assert ids(allocate("H100-SXM", 2, 1, "nvlink", [n], {})) == [("n1", ["gpu0", "gpu1"])]
    assert ids(allocate("H100-SXM", 2, 1, "pcie", [n], {})) == [("n1", ["gpu0", "gpu1"])]


def test_nvlink_request_refused_on_pcie_node() -> None:
    assert "over pcie, not nvlink" in refusal("H100-SXM", 2, 1, "nvlink", [node("n1", gpus(2))], {})


PAIRS = {0: [1], 1: [0], 2: [3], 3: [2]}  # gpu0-gpu1 and gpu2-gpu3 are NVLink pairs


def test_nvlink_pair_is_a_linked_pair() -> None:
    n = node("n1", gpus(4, "A100-80GB", peers=PAIRS), gpu_fabric="nvlink")
    assert ids(allocate("A100-80GB", 2, 1, "nvlink", [n], {})) == [("n1", ["gpu0", "gpu1"])]


def test_nvlink_pair_skips_a_broken_pair() -> None:
    n = node("n1", gpus(4, "A100-80GB", peers=PAIRS), gpu_fabric="nvlink")
    # gpu1 held: gpu0 has no free partner, so the next linked pair is chosen, not gpu0+gpu2
    alloc = allocate("A100-80GB", 2, 1, "nvlink", [n], {("n1", "gpu1"): "other"})
    assert ids(alloc) == [("n1", ["gpu2", "gpu3"])]


def test_nvlink_three_of_pairs_refused() -> None:
    n = node("n1", gpus(4, "A100-80GB", peers=PAIRS), gpu_fabric="nvlink")
    msg = refusal("A100-80GB", 3, 1, "nvlink", [n], {})
    assert "need 3 A100-80GB" in msg
    assert "no 3 free A100-80GB all linked by NVLink" in msg


def test_nvlink_pairs_on_pcie_request_are_not_constrained() -> None:
    n = node("n1", gpus(4, "A100-80GB", peers=PAIRS), gpu_fabric="nvlink")
    assert allocate("A100-80GB", 3, 1, "pcie", [n], {}).device_count == 3


def test_nvlink_full_clique_of_four() -> None:
    full = {i: [j for j in range(4) if j != i] for i in range(4)}
    n = node("n1", gpus(4, "A100-80GB", peers=full), gpu_fabric="nvlink")
    assert allocate("A100-80GB", 4, 1, "nvlink", [n], {}).device_count == 4


def test_nvlink_clique_found_when_greedy_first_choice_is_wrong() -> None:
    peers = {0: [1, 2, 3], 1: [0], 2: [0, 3], 3: [0, 2]}
    n = node("n1", gpus(4, "A100-80GB", peers=peers), gpu_fabric="nvlink")
    assert ids(allocate("A100-80GB", 3, 1, "nvlink", [n], {})) == [("n1", ["gpu0", "gpu2", "gpu3"])]


# ---------------------------------------------------------------- several nodes


def test_request_split_evenly_over_nodes() -> None:
    nodes = [node(f"n{i}", gpus(8), inter_fabric="ethernet") for i in (1, 2)]
    alloc = allocate("H100-SXM", 8, 2, "ethernet", nodes, {})
    assert [len(p.devices) for p in alloc.placements] == [8 // 2, 8 // 2]
    assert sorted(p.node_id for p in alloc.placements) == ["n1", "n2"]


def test_best_fit_uses_the_node_with_fewest_spare_devices_first() -> None:
    roomy = node("a-roomy", gpus(8))  # 8 free: 6 spare after 2
    snug = node("b-snug", gpus(8))  # 3 free: 1 spare after 2
    reserved = {("b-snug", f"gpu{i}"): "other" for i in range(5)}
    alloc = allocate("H100-SXM", 2, 1, "pcie", [roomy, snug], reserved)
    assert ids(alloc) == [("b-snug", ["gpu5", "gpu6"])]


def test_several_nodes_take_only_untouched_nodes() -> None:
    n1 = node("n1", gpus(8), inter_fabric="infiniband")
    n2 = node("n2", gpus(8), inter_fabric="infiniband")  # one device held by a one-node cluster
    n3 = node("n3", gpus(8), inter_fabric="infiniband")
    alloc = allocate("H100-SXM", 8, 2, "infiniband", [n1, n2, n3], {("n2", "gpu0"): "x"})
    assert ids(alloc) == [("n1", ["gpu0", "gpu1", "gpu2", "gpu3"]),
                          ("n3", ["gpu0", "gpu1", "gpu2", "gpu3"])]
    msg = refusal("H100-SXM", 16, 2, "infiniband", [n1, n2], {("n2", "gpu0"): "x"})
    assert "node n2 is partly held (by cluster x); a multi-node cluster takes whole nodes" in msg


def test_ties_broken_by_node_id() -> None:
    nodes = [node("n2", gpus(4)), node("n1", gpus(4))]
    assert ids(allocate("H100-SXM", 4, 1, "pcie", nodes, {})) == [("n1", ["gpu0", "gpu1", "gpu2", "gpu3"])]


def test_too_few_nodes_with_room_refused() -> None:
    nodes = [node("n1", gpus(8), inter_fabric="ethernet"), node("n2", gpus(2), inter_fabric="ethernet")]
    msg = refusal("H100-SXM", 8, 2, "ethernet", nodes, {})
    assert "need 8 H100-SXM (4 on each of 2 node(s))" in msg
    assert f"{8 + 2} free" in msg
    assert "node n2 has 2 of 2 H100-SXM free" in msg


def test_infiniband_request_on_infiniband_nodes() -> None:
    nodes = [node(f"n{i}", gpus(8), inter_fabric="infiniband") for i in (1, 2)]
    assert allocate("H100-SXM", 16, 2, "infiniband", nodes, {}).device_count == 16


@pytest.mark.parametrize("inter", [None, "ethernet"])
def test_infiniband_request_refused_without_infiniband(inter: str | None) -> None:
    nodes = [node(f"n{i}", gpus(8), inter_fabric=inter) for i in (1, 2)]
    msg = refusal("H100-SXM", 16, 2, "infiniband", nodes, {})
    assert "node n1 has no infiniband to other nodes" in msg
    assert "node n2 has no infiniband to other nodes" in msg


def test_infiniband_only_on_the_nodes_that_have_it() -> None:
    nodes = [node("n1", gpus(8), inter_fabric=None), node("n2", gpus(8), inter_fabric="infiniband"),
             node("n3", gpus(8), inter_fabric="infiniband")]
    alloc = allocate("H100-SXM", 8, 2, "infiniband", nodes, {})
    assert sorted(p.node_id for p in alloc.placements) == ["n2", "n3"]
