"""Reading a Ray cluster's node table as pool nodes (backends/ray.py), without Ray.

Each entry is shaped like one of `ray.nodes()`. What an operator declares with labels and
resources decides what gpufleet may allocate, so a misread label would put jobs on devices that
are not there, or hide a dead node from `pool list`.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.backends.ray import is_loopback, node_from_ray, nodes_from_ray

RAY_ID = "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8"


def entry(labels: dict[str, str] | None = None, resources: dict[str, float] | None = None, *,
          alive: bool = True, node_id: str = RAY_ID, address: str = "10.0.0.7") -> dict[str, Any]:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": address,
            "Resources": {"CPU": 16.0, "memory": 6.4e10, **(resources or {})},
            "Labels": labels or {}}


# ---------------------------------------------------------------- one node


def test_gpufleet_labels_describe_the_node() -> None:
    node = node_from_ray(entry(
        {"gpufleet/gpu": "H100", "gpufleet/fabric": "nvswitch", "gpufleet/network": "infiniband",
         "gpufleet/simulated": "true", "gpufleet/node": "worker1"},
        {"gpufleet_gpu": 4.0}))
    assert node.id == "worker1"
    assert node.ref == RAY_ID
    assert node.address == "10.0.0.7"
    assert node.healthy
    assert (node.gpu_fabric, node.inter_fabric) == ("nvswitch", "infiniband")
    assert [d.id for d in node.devices] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert [d.index for d in node.devices] == [0, 1, 2, 3]
    assert {d.gpu for d in node.devices} == {"H100-SXM"}
    assert all(d.simulated and d.healthy for d in node.devices)
    assert node.devices[0].memory_bytes == 80 * 10**9
    assert node.devices[2].nvlink_peers == (0, 1, 3)


def test_defaults_without_fabric_network_or_name() -> None:
    node = node_from_ray(entry({"gpufleet/gpu": "RTX4090"}, {"GPU": 2.0}))
    assert node.id == RAY_ID[:12]
    assert (node.gpu_fabric, node.inter_fabric) == ("pcie", "ethernet")
    assert all(not d.simulated and d.nvlink_peers == () for d in node.devices)
    assert [d.gpu for d in node.devices] == ["RTX4090", "RTX4090"]


def test_gpufleet_gpu_resource_wins_over_ray_gpu() -> None:
    node = node_from_ray(entry({"gpufleet/gpu": "A100"}, {"gpufleet_gpu": 2.0, "GPU": 8.0}))
    assert len(node.devices) == 2
    assert len(node_from_ray(entry({"gpufleet/gpu": "A100"}, {"GPU": 8.0})).devices) == 8


def test_count_tolerates_float_error_and_drops_fractions() -> None:
    assert len(node_from_ray(entry({"gpufleet/gpu": "T4"}, {"GPU": 3.9999999999})).devices) == 4
    assert len(node_from_ray(entry({"gpufleet/gpu": "T4"}, {"GPU": 2.5})).devices) == 2


def test_ray_accelerator_label_when_no_gpufleet_label() -> None:
    node = node_from_ray(entry({"ray.io/accelerator-type": "A100"}, {"GPU": 8.0}))
    assert {d.gpu for d in node.devices} == {"A100-80GB"}
    assert all(d.healthy for d in node.devices)


def test_ray_accelerator_resource_when_no_label() -> None:
    node = node_from_ray(entry(None, {"GPU": 4.0, "accelerator_type:H100": 1.0}))
    assert [d.gpu for d in node.devices] == ["H100-SXM"] * 4


def test_gpufleet_label_wins_over_ray_accelerator_type() -> None:
    node = node_from_ray(entry({"gpufleet/gpu": "H200", "ray.io/accelerator-type": "H100"},
                               {"GPU": 1.0, "accelerator_type:A100": 1.0}))
    assert node.devices[0].gpu == "H200"


def test_cpu_only_node_offers_nothing() -> None:
    node = node_from_ray(entry(None, {"CPU": 32.0}))
    assert node.devices == ()
    assert node.healthy


def test_labels_and_resources_may_be_missing() -> None:
    node = node_from_ray({"NodeID": RAY_ID, "Alive": True, "NodeManagerAddress": "10.0.0.9"})
    assert node.devices == ()
    assert node.id == RAY_ID[:12]


def test_simulated_label_values() -> None:
    for value, want in [("1", True), ("TRUE", True), ("yes", True), ("false", False), ("0", False),
                        ("", False)]:
        node = node_from_ray(entry({"gpufleet/gpu": "H100", "gpufleet/simulated": value},
                                   {"gpufleet_gpu": 1.0}))
        assert node.devices[0].simulated is want, value


def test_dead_node_is_kept_unhealthy() -> None:
    node = node_from_ray(entry({"gpufleet/gpu": "H100", "gpufleet/node": "worker2"}, {"GPU": 8.0},
                               alive=False))
    assert node.id == "worker2"
    assert not node.healthy
    assert len(node.devices) == 8
    assert not any(d.healthy for d in node.devices)


@pytest.mark.parametrize(("labels", "resources", "name"), [
    ({"gpufleet/gpu": "Z9000"}, {"GPU": 2.0}, "unknown:Z9000"),
    ({"ray.io/accelerator-type": "B300"}, {"GPU": 2.0}, "unknown:B300"),
    ({}, {"GPU": 2.0}, "unknown:GPU"),
])
def test_unknown_type_gives_unusable_devices(labels: dict[str, str], resources: dict[str, float],
                                             name: str) -> None:
    node = node_from_ray(entry(labels, resources))
    assert node.healthy
    assert [d.gpu for d in node.devices] == [name, name]
    assert not any(d.healthy for d in node.devices)
    assert all(d.memory_bytes == 0 for d in node.devices)


def test_bad_fabric_and_network_labels_fall_back() -> None:
    node = node_from_ray(entry({"gpufleet/gpu": "H100", "gpufleet/fabric": "nvlink5",
                                "gpufleet/network": "roce"}, {"GPU": 2.0}))
    assert (node.gpu_fabric, node.inter_fabric) == ("pcie", "ethernet")
    assert all(d.nvlink_peers == () for d in node.devices)


def test_nvlink_fabric_label() -> None:
    node = node_from_ray(entry({"gpufleet/gpu": "H100-PCIe", "gpufleet/fabric": "nvlink"}, {"GPU": 2.0}))
    assert node.gpu_fabric == "nvlink"
    assert [d.nvlink_peers for d in node.devices] == [(1,), (0,)]


# ---------------------------------------------------------------- the whole table


def named(name: str, *, alive: bool, ray_id: str) -> dict[str, Any]:
    return entry({"gpufleet/gpu": "H100", "gpufleet/node": name}, {"GPU": 8.0}, alive=alive,
                 node_id=ray_id)


@pytest.mark.parametrize("dead_first", [True, False])
def test_a_rejoined_node_shows_its_live_entry(dead_first: bool) -> None:
    dead = named("worker1", alive=False, ray_id="old" + "0" * 53)
    live = named("worker1", alive=True, ray_id="new" + "0" * 53)
    nodes = nodes_from_ray([dead, live] if dead_first else [live, dead])
    assert len(nodes) == 1
    assert nodes[0].healthy
    assert nodes[0].ref == live["NodeID"]
    assert all(d.healthy for d in nodes[0].devices)


def test_a_node_that_stayed_gone_is_listed_lost() -> None:
    nodes = nodes_from_ray([named("head", alive=True, ray_id="h" * 56),
                            named("worker1", alive=False, ray_id="w" * 56)])
    assert [(n.id, n.healthy) for n in nodes] == [("head", True), ("worker1", False)]


def test_head_first_then_by_name() -> None:
    raw = [named(n, alive=True, ray_id=f"{i:056d}")
           for i, n in enumerate(["worker2", "a-node", "head", "worker1"])]
    assert [n.id for n in nodes_from_ray(raw)] == ["head", "a-node", "worker1", "worker2"]


def test_unlabelled_nodes_are_told_apart_by_ray_id() -> None:
    raw = [entry(None, {"GPU": 1.0, "accelerator_type:T4": 1.0}, node_id=f"{i:02d}" + "f" * 54)
           for i in range(3)]
    assert len(nodes_from_ray(raw)) == 3


def test_empty_table() -> None:
    assert nodes_from_ray([]) == []


# ---------------------------------------------------------------- addresses and auth


@pytest.mark.parametrize(("address", "want"), [
    ("127.0.0.1:6379", True),
    ("127.0.1.1:6390", True),
    ("127.0.0.1", True),
    ("localhost:6379", True),
    ("[::1]:6379", True),
    ("10.0.0.5:6379", False),
    ("10.0.0.127:6379", False),
    ("192.168.1.2", False),
    ("ray-head.internal:6379", False),
])
def test_is_loopback(address: str, want: bool) -> None:
    assert is_loopback(address) is want


def test_bare_ipv6_loopback_is_loopback() -> None:
    assert is_loopback("::1")
