"""What `pool list` shows (pools.node_rows and pools.grouped) and the Ray address check.

FREE is what a user reads before asking for a cluster: counting a held or broken device as free
promises capacity the allocator will refuse, and a lost node must not look usable.
"""

from __future__ import annotations

import pytest

from gpufleet.backends.sim import build_nodes, parse_shapes
from gpufleet.errors import SpecError
from gpufleet.lifecycle.pools import check_address, grouped, node_rows
from gpufleet.pool.model import Device, Node

GB80 = 80 * 10**9


def devices(n: int, gpu: str = "H100-SXM", *, unhealthy: tuple[int, ...] = (), simulated: bool = False,
            start: int = 0) -> tuple[Device, ...]:
    return tuple(Device(id=f"gpu{i}", index=i, gpu=gpu, memory_bytes=GB80, healthy=i not in unhealthy,
                        simulated=simulated) for i in range(start, start + n))


def mk(nid: str, devs: tuple[Device, ...], **kw: object) -> Node:
    return Node(id=nid, address=f"{nid}.lan", devices=devs, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- node_rows


def test_a_free_node() -> None:
    [row] = node_rows([mk("n1", devices(8), gpu_fabric="nvswitch", inter_fabric="infiniband")], {})
    assert row == {"node": "n1", "address": "n1.lan", "gpu": "H100-SXM", "count": 8, "free": 8,
                   "memory_gb": 80.0, "fabric": "nvswitch", "network": "infiniband", "health": "ok",
                   "simulated": False, "held_by": []}


def test_free_excludes_held_devices_and_names_holders() -> None:
    held = {("n1", "gpu0"): "llama", ("n1", "gpu1"): "llama", ("n1", "gpu5"): "bert",
            ("n2", "gpu0"): "other"}
    [row] = node_rows([mk("n1", devices(8))], held)
    assert (row["count"], row["free"]) == (8, 5)
    assert row["held_by"] == ["bert", "llama"]


def test_free_excludes_unhealthy_devices() -> None:
    [row] = node_rows([mk("n1", devices(8, unhealthy=(2, 3)))], {("n1", "gpu0"): "x"})
    assert (row["count"], row["free"]) == (8, 5)
    assert row["health"] == "unhealthy devices"


def test_a_held_unhealthy_device_is_not_subtracted_twice() -> None:
    [row] = node_rows([mk("n1", devices(4, unhealthy=(0,)))], {("n1", "gpu0"): "x"})
    assert row["free"] == 3
    assert row["held_by"] == ["x"]


def test_a_lost_node_has_nothing_free() -> None:
    [row] = node_rows([mk("n1", devices(8), healthy=False)], {})
    assert row["health"] == "lost"
    assert row["free"] == 0
    assert row["count"] == 8


def test_lost_wins_over_unhealthy_devices() -> None:
    [row] = node_rows([mk("n1", devices(2, unhealthy=(1,)), healthy=False)], {})
    assert (row["health"], row["free"]) == ("lost", 0)


def test_simulated_flag_and_network_dash() -> None:
    [row] = node_rows([mk("n1", devices(2, simulated=True))], {})
    assert row["simulated"] is True
    assert row["network"] == "-"
    assert row["fabric"] == "pcie"


def test_a_node_with_two_types_gives_two_rows() -> None:
    node = mk("n1", devices(2, "A100-80GB") + devices(2, "H100-SXM", start=2), gpu_fabric="nvswitch")
    rows = node_rows([node], {("n1", "gpu2"): "x"})
    assert [(r["gpu"], r["count"], r["free"], r["held_by"]) for r in rows] == [
        ("A100-80GB", 2, 2, []), ("H100-SXM", 2, 1, ["x"])]


def test_cpu_slots_show_shared_memory_not_the_nodes_gpu_fabric() -> None:
    node = mk("local", tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=0) for i in range(4)),
              gpu_fabric="nvswitch")
    [row] = node_rows([node], {})
    assert (row["gpu"], row["fabric"], row["memory_gb"]) == ("cpu", "shared memory", 0.0)


def test_a_node_without_devices_still_shows() -> None:
    [row] = node_rows([mk("cpu-only", ())], {})
    assert (row["gpu"], row["count"], row["free"], row["health"]) == ("-", 0, 0, "ok")


def test_one_row_per_node_in_order() -> None:
    rows = node_rows([mk("b", devices(1)), mk("a", devices(1))], {})
    assert [r["node"] for r in rows] == ["b", "a"]


# ---------------------------------------------------------------- grouped


def test_grouped_sums_alike_nodes() -> None:
    nodes = [mk(f"n{i}", devices(8), inter_fabric="infiniband") for i in range(3)]
    held = {("n0", "gpu0"): "a", ("n2", "gpu7"): "b", ("n2", "gpu6"): "a"}
    [g] = grouped(node_rows(nodes, held))
    assert (g["node"], g["nodes"], g["count"], g["free"]) == ("3 nodes", 3, 24, 21)
    assert g["held_by"] == ["a", "b"]
    assert g["address"] == "-"
    assert (g["gpu"], g["fabric"], g["network"], g["health"]) == ("H100-SXM", "pcie", "infiniband", "ok")


def test_grouped_keeps_unlike_nodes_apart() -> None:
    nodes = [mk("a", devices(8)), mk("b", devices(4)), mk("c", devices(8), healthy=False),
             mk("d", devices(8, simulated=True)), mk("e", devices(8), gpu_fabric="nvswitch"),
             mk("f", devices(8), inter_fabric="ethernet"), mk("g", devices(8, "A100-80GB")),
             mk("h", devices(8))]
    groups = grouped(node_rows(nodes, {}))
    assert len(groups) == 7
    plain = next(g for g in groups if g["nodes"] == 2)
    assert (plain["count"], plain["free"]) == (16, 16)
    lost = next(g for g in groups if g["health"] == "lost")
    assert (lost["count"], lost["free"]) == (8, 0)
    assert sum(g["nodes"] for g in groups) == len(nodes)


def test_grouped_sim_pool() -> None:
    nodes = build_nodes("big", parse_shapes(["2000xH100:8", "400xRTX4090:4:ethernet"]))
    held = {(f"big-h100-sxm-{i}", f"gpu{k}"): f"c{i % 3}" for i in range(10) for k in range(8)}
    groups = grouped(node_rows(nodes, held))
    by_gpu = {g["gpu"]: g for g in groups}
    assert set(by_gpu) == {"H100-SXM", "RTX4090"}
    assert (by_gpu["H100-SXM"]["count"], by_gpu["H100-SXM"]["free"]) == (16_000, 16_000 - 80)
    assert by_gpu["H100-SXM"]["held_by"] == ["c0", "c1", "c2"]
    assert (by_gpu["RTX4090"]["nodes"], by_gpu["RTX4090"]["free"]) == (400, 1600)
    assert all(g["simulated"] for g in groups)


def test_grouped_leaves_its_input_alone() -> None:
    rows = node_rows([mk("a", devices(2)), mk("b", devices(2))], {("a", "gpu0"): "x"})
    before = [dict(r) for r in rows]
    grouped(rows)
    assert rows == before


def test_grouped_nothing() -> None:
    assert grouped([]) == []


# ---------------------------------------------------------------- check_address


@pytest.mark.parametrize("address", ["10.0.0.5:6379", "127.0.1.1:6390", "ray-head.internal:6379",
                                     "[::1]:6379", "h:1", "h:65535"])
def test_good_addresses(address: str) -> None:
    assert check_address(address) == address


@pytest.mark.parametrize("address", ["nohost", "host:0", "host:99999", "host:65536", "host:",
                                     "host:123456", "10.0.0.5", "http://10.0.0.5:6379", "host :6379",
                                     "", ":6379", "host:-1"])
def test_bad_addresses(address: str) -> None:
    with pytest.raises(SpecError) as info:
        check_address(address)
    assert [f for f, _ in info.value.problems] == ["address"]
    assert "is not HOST:PORT of a Ray head" in str(info.value)
