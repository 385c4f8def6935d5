"""Synthetic pools (backends/sim.py): the shape text a user types, and the nodes it becomes.

Node names must be the same on every discovery, or the reservations a sim pool's clusters hold
would point at nodes that no longer exist; every device must be marked simulated, or a planning
cluster could be billed or run.
"""

from __future__ import annotations

import pytest

from gpufleet import catalog
from gpufleet.backends.sim import MAX_NODES, Shape, SimBackend, build_nodes, parse_shape, parse_shapes
from gpufleet.errors import SpecError
from gpufleet.pool.allocate import allocate


def problem(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_shape(text)
    assert [f for f, _ in info.value.problems] == ["shape"]
    return info.value.problems[0][1]


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(("text", "want"), [
    ("1000xH100:8", Shape(1000, "H100-SXM", 8, "infiniband")),
    ("400xRTX4090:4:ethernet", Shape(400, "RTX4090", 4, "ethernet")),
    ("2xa100:8:infiniband", Shape(2, "A100-80GB", 8, "infiniband")),
    ("3xh100-pcie:2", Shape(3, "H100-PCIe", 2, "infiniband")),
    ("1x4090:1", Shape(1, "RTX4090", 1, "infiniband")),
    ("  16 x H200 : 8 : ethernet ", Shape(16, "H200", 8, "ethernet")),
    (f"{MAX_NODES}xT4:8", Shape(MAX_NODES, "T4", 8, "infiniband")),
])
def test_shapes_parse(text: str, want: Shape) -> None:
    assert parse_shape(text) == want


def test_shape_text_round_trips() -> None:
    s = parse_shape("400xRTX4090:4:ethernet")
    assert s.text() == "400xRTX4090:4:ethernet"
    assert parse_shape(parse_shape("1000xH100:8").text()) == Shape(1000, "H100-SXM", 8, "infiniband")


@pytest.mark.parametrize("text", ["", "H100:8", "1000xH100", "1000x:8", "x H100:8", "1000xH100:8:",
                                  "1000xH100:eight", "-1xH100:8", "1000xH100:8:infiniband:extra",
                                  "1000xH100:8:InfiniBand", "1000*H100:8"])
def test_malformed_text_is_not_a_shape(text: str) -> None:
    msg = problem(text)
    assert "is not a shape" in msg
    assert "NODESxGPU:PER_NODE[:NETWORK]" in msg


@pytest.mark.parametrize("per", [0, 9, 16])
def test_devices_per_node_must_be_one_to_eight(per: int) -> None:
    assert f"{per} devices per node; must be 1 to 8" in problem(f"10xH100:{per}")


@pytest.mark.parametrize("nodes", [0, MAX_NODES + 1])
def test_node_count_is_bounded(nodes: int) -> None:
    assert f"{nodes} nodes; must be 1 to {MAX_NODES}" in problem(f"{nodes}xH100:8")


@pytest.mark.parametrize("network", ["roce", "nvlink", "pcie"])
def test_unknown_network_is_refused(network: str) -> None:
    msg = problem(f"10xH100:8:{network}")
    assert f"network '{network}' is not allowed" in msg
    assert "infiniband, ethernet" in msg


def test_unknown_gpu_is_refused_under_the_shape_field() -> None:
    msg = problem("10xZ9000:8")
    assert "unknown GPU type 'Z9000'" in msg


def test_parse_shapes_keeps_order() -> None:
    shapes = parse_shapes(["2xH100:8", "3xRTX4090:4:ethernet"])
    assert [s.gpu for s in shapes] == ["H100-SXM", "RTX4090"]


def test_parse_shapes_needs_one() -> None:
    with pytest.raises(SpecError) as info:
        parse_shapes([])
    assert info.value.problems[0][0] == "shape"
    assert "at least one --shape" in str(info.value)


def test_parse_shapes_caps_the_total() -> None:
    half = MAX_NODES // 2
    assert sum(s.nodes for s in parse_shapes([f"{half}xH100:8", f"{half}xRTX4090:4"])) == MAX_NODES
    with pytest.raises(SpecError) as info:
        parse_shapes([f"{half}xH100:8", f"{half + 1}xRTX4090:4"])
    assert info.value.problems == [("shape", f"{MAX_NODES + 1} nodes in all; at most {MAX_NODES}")]


def test_parse_shapes_reports_the_bad_one() -> None:
    with pytest.raises(SpecError, match="'5xH100:9'"):
        parse_shapes(["2xH100:8", "5xH100:9"])


# ---------------------------------------------------------------- nodes


def test_node_names_are_stable_and_unique() -> None:
    shapes = parse_shapes(["3xH100:8", "2xRTX4090:4:ethernet", "2xH100:8:ethernet"])
    nodes = build_nodes("lab", shapes)
    ids = [n.id for n in nodes]
    assert ids == ["lab-h100-sxm-0", "lab-h100-sxm-1", "lab-h100-sxm-2",
                   "lab-rtx4090-0", "lab-rtx4090-1",
                   "lab-h100-sxm-3", "lab-h100-sxm-4"]
    assert [n.id for n in build_nodes("lab", shapes)] == ids
    assert all(n.address == n.id for n in nodes)
    assert {n.id for n in build_nodes("other", shapes)}.isdisjoint(ids)


def test_every_device_is_simulated_and_healthy() -> None:
    nodes = build_nodes("p", parse_shapes(["4xH100:8", "4xRTX4090:4:ethernet"]))
    devs = [d for n in nodes for d in n.devices]
    assert len(devs) == 4 * 8 + 4 * 4
    assert all(d.simulated and d.healthy for d in devs)
    assert all(n.healthy for n in nodes)
    for n in nodes:
        assert [d.id for d in n.devices] == [f"gpu{i}" for i in range(len(n.devices))]
        assert [d.index for d in n.devices] == list(range(len(n.devices)))


def test_fabric_and_memory_come_from_the_catalog() -> None:
    h100, rtx = build_nodes("p", parse_shapes(["1xH100:8", "1xRTX4090:4:ethernet"]))
    assert (h100.gpu_fabric, h100.inter_fabric) == ("nvswitch", "infiniband")
    assert (rtx.gpu_fabric, rtx.inter_fabric) == ("pcie", "ethernet")
    assert {d.gpu for d in h100.devices} == {"H100-SXM"}
    assert h100.devices[0].memory_bytes == int(catalog.gpu_types()["H100-SXM"].memory_gb * 1e9)
    assert rtx.devices[0].memory_bytes == int(catalog.gpu_types()["RTX4090"].memory_gb * 1e9)


def test_nvlink_peers_only_on_linked_fabrics() -> None:
    h100, rtx = build_nodes("p", parse_shapes(["1xH100:4", "1xRTX4090:4"]))
    assert h100.devices[1].nvlink_peers == (0, 2, 3)
    assert all(d.nvlink_peers == () for d in rtx.devices)


def test_sim_nodes_serve_the_allocator() -> None:
    nodes = build_nodes("p", parse_shapes(["4xH100:8", "4xRTX4090:4:ethernet"]))
    alloc = allocate("H100-SXM", 32, None, "infiniband", nodes, {})
    assert len(alloc.placements) == 4
    assert all(d.simulated for p in alloc.placements for d in p.devices)
    alloc = allocate("RTX4090", 8, 2, "ethernet", nodes, {})
    assert {p.node_id for p in alloc.placements} == {"p-rtx4090-0", "p-rtx4090-1"}


def test_discover_a_sixteen_thousand_gpu_pool() -> None:
    backend = SimBackend("big", parse_shapes(["2000xH100:8"]))
    nodes = backend.discover()
    assert backend.name == "sim"
    assert len(nodes) == 2000
    assert sum(len(n.devices) for n in nodes) == 16_000
    assert len({n.id for n in nodes}) == 2000
    assert nodes[0].id == "big-h100-sxm-0" and nodes[-1].id == "big-h100-sxm-1999"
    assert backend.discover() is nodes
