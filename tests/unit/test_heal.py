"""clusters.launch and spares.heal on a pool of several nodes, against a real SQLite file: a
multi-node cluster holds whole nodes, a lost node is replaced by a spare node first, else by a
free whole node of the same group, and with none free the cluster goes on smaller, its cost
banked at the old rate. Spare nodes are held whole and billed, but never placed on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.errors import AllocationError, SpecError
from gpufleet.lifecycle import clusters, ledger, spares
from gpufleet.plan import cost
from gpufleet.pool.model import Device, Node
from gpufleet.spec import ClusterSpec
from gpufleet.store import LedgerRow, Store


def _node(name: str, network: str = "infiniband", simulated: bool = False) -> Node:
    devices = tuple(Device(id=f"gpu{i}", index=i, gpu="H100-SXM", memory_bytes=80 * 10**9,
                           simulated=simulated) for i in range(2))
    return Node(name, f"10.0.0.{len(name)}", devices, gpu_fabric="nvswitch",
                inter_fabric=network, free_disk_bytes=1 << 40)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    return Store(url=f"sqlite:///{tmp_path}/s.db")


def _spec(name: str, count: int = 4, nodes: int | None = 2, spare: int = 0) -> ClusterSpec:
    return ClusterSpec.parse({"name": name, "gpu": "H100", "count": count, "nodes": nodes,
                              "network": "infiniband", "backend": "ray", "pool": "p",
                              "spares": spare})


def _spare_nodes(store: Store, name: str) -> list[str]:
    return [p.node_id for p in clusters.spares(store, clusters.get(store, name))]


def _rate(devices: int, book: str | None) -> float:
    assert book is not None
    rate = cost.cluster_rate("H100-SXM", devices, "infiniband", book)
    assert rate is not None
    return rate.usd_per_hour


def _held_nodes(store: Store, name: str) -> list[str]:
    return [p.node_id for p in clusters.placements(store, clusters.get(store, name))]


def test_a_multi_node_cluster_holds_its_nodes_whole(store: Store) -> None:
    nodes = [_node("a"), _node("b"), _node("c")]
    c = clusters.launch(store, _spec("big", count=2), nodes, pool="p")  # 1 device per node
    assert (c.nodes, c.count, c.network) == (2, 2, "infiniband")
    assert _held_nodes(store, "big") == ["a", "b"]
    one = clusters.launch(store, _spec("one", count=1, nodes=1), nodes, pool="p")
    assert _held_nodes(store, one.name) == ["c"]  # not the spare devices of a or b
    with pytest.raises(AllocationError, match="held whole by cluster big"):
        clusters.launch(store, _spec("two", count=2, nodes=1), nodes, pool="p")


def test_pools_do_not_see_each_others_reservations(store: Store) -> None:
    nodes = [_node("a"), _node("b")]
    clusters.launch(store, _spec("x"), nodes, pool="p")
    other = _spec("y").model_copy(update={"pool": "q"})
    assert clusters.launch(store, other, nodes, pool="q").nodes == 2  # same names, other pool


def test_simulated_devices_are_quoted_but_never_billed(store: Store) -> None:
    nodes = [_node("a", simulated=True), _node("b", simulated=True)]
    c = clusters.launch(store, _spec("sim"), nodes, pool="p")
    assert c.simulated and c.usd_per_hour == 0 and c.price_book is None
    real = clusters.launch(store, _spec("real"), [_node("c"), _node("d")], pool="p")
    assert not real.simulated and real.usd_per_hour > 0


def test_a_lost_node_is_replaced_by_a_free_whole_node(store: Store) -> None:
    nodes = [_node("a"), _node("b"), _node("c"), _node("d", network="ethernet")]
    c = clusters.launch(store, _spec("big"), nodes, pool="p")
    seen = [dataclasses.replace(n, healthy=False) if n.id == "b" else n for n in nodes]
    c, notes = spares.heal(store, c, seen)
    assert notes == ["node b lost; replaced by node c (10.0.0.1)"]
    assert _held_nodes(store, "big") == ["a", "c"]  # not d: another network
    assert (c.nodes, c.count) == (2, 4)
    assert spares.heal(store, c, seen)[1] == []  # nothing more to do


def test_with_no_free_node_the_cluster_goes_on_smaller_and_banks_its_cost(store: Store) -> None:
    nodes = [_node("a"), _node("b")]
    c = clusters.launch(store, _spec("big"), nodes, pool="p")
    rate = c.usd_per_hour
    assert rate > 0
    c, notes = spares.heal(store, c, [nodes[0]])  # b left the Ray cluster
    assert len(notes) == 1 and notes[0].startswith("node b lost; no replacement")
    assert (c.nodes, c.count) == (1, 2) and _held_nodes(store, "big") == ["a"]
    assert 0 < c.usd_per_hour < rate and c.rate_since is not None
    with pytest.raises(AllocationError, match="every node of big is lost"):
        spares.heal(store, c, [])


def test_a_grown_reservation_is_held_in_the_clusters_own_pool(store: Store) -> None:
    """`resize` once read the free devices from this host's reservations and made its rows
    without `pool=`: on a pool it took a device the cluster already held, in 'local'."""
    from sqlalchemy import select

    from gpufleet.store import Reservation

    nodes = [_node("a")]
    c = clusters.launch(store, _spec("one", count=1, nodes=1), nodes, pool="p")
    clusters.resize(store, c.id, 2, nodes)
    with store.read() as s:
        rows = s.execute(select(Reservation.device_id, Reservation.pool)
                         .where(Reservation.cluster_id == c.id)).all()
        held = clusters.held(s, "p")
    assert sorted(rows) == [("gpu0", "p"), ("gpu1", "p")]
    assert held == {("a", "gpu0"): "one", ("a", "gpu1"): "one"}


def test_spare_nodes_are_held_whole_and_billed_but_never_placed_on(store: Store) -> None:
    nodes = [_node("a"), _node("b"), _node("c"), _node("d")]
    c = clusters.launch(store, _spec("big", spare=1), nodes, pool="p")
    assert (c.nodes, c.count) == (2, 4)
    assert _held_nodes(store, "big") == ["a", "b"] and _spare_nodes(store, "big") == ["c"]
    assert c.usd_per_hour == pytest.approx(_rate(6, c.price_book))  # 2 + 1 spare nodes of 2
    assert c.usd_per_hour > _rate(4, c.price_book)
    assert (c.spares, c.billed_devices) == (1, 6)
    ledger.accrue(store, c.started_at + 3600)  # its idle hour, booked with the spare's devices
    with store.read() as s:
        booked = s.execute(select(LedgerRow.devices, LedgerRow.micro_usd)).all()
    assert booked == [(6, round(c.usd_per_hour * 1_000_000))]
    one = clusters.launch(store, _spec("one", count=1, nodes=1), nodes, pool="p")
    assert _held_nodes(store, one.name) == ["d"]  # not the spare's free-looking devices
    with pytest.raises(AllocationError, match=r"\(a, b, c\): is held whole by cluster big"):
        clusters.launch(store, _spec("two", count=2, nodes=1), nodes, pool="p")


def test_a_lost_node_is_replaced_by_a_spare_and_a_new_spare_is_reserved(store: Store) -> None:
    nodes = [_node("a"), _node("b"), _node("c"), _node("d"), _node("e")]
    c = clusters.launch(store, _spec("big", spare=1), nodes, pool="p")
    rate = c.usd_per_hour
    seen = [dataclasses.replace(n, healthy=False) if n.id == "b" else n for n in nodes]
    c, notes = spares.heal(store, c, seen)
    assert notes == ["node b lost; replaced by spare node c (10.0.0.1)",
                     "new spare node d (10.0.0.1) reserved; the next run warms it"]
    assert _held_nodes(store, "big") == ["a", "c"] and _spare_nodes(store, "big") == ["d"]
    assert (c.nodes, c.count, c.usd_per_hour) == (2, 4, rate)  # still 3 nodes held
    assert spares.heal(store, c, seen)[1] == []


def test_with_no_free_node_for_a_new_spare_the_bill_drops_to_what_is_held(store: Store) -> None:
    nodes = [_node("a"), _node("b"), _node("c")]
    c = clusters.launch(store, _spec("big", spare=1), nodes, pool="p")
    c, notes = spares.heal(store, c, [nodes[0], nodes[2]])  # b is gone
    assert notes[0] == "node b lost; replaced by spare node c (10.0.0.1)"
    assert notes[1].startswith("no free node for a new spare (") and \
        notes[1].endswith("); 0 spare node(s) left"), notes
    assert _held_nodes(store, "big") == ["a", "c"] and _spare_nodes(store, "big") == []
    assert c.usd_per_hour == pytest.approx(_rate(4, c.price_book)) and c.rate_since is not None
    assert (c.spares, c.billed_devices) == (0, 4)
    c, notes = spares.heal(store, c, [nodes[0]])  # then c too: no spare, no free node
    assert notes[0].startswith("node c lost; no replacement") and c.nodes == 1


def test_a_lost_spare_is_let_go_and_made_up(store: Store) -> None:
    nodes = [_node("a"), _node("b"), _node("c"), _node("d")]
    c = clusters.launch(store, _spec("big", spare=1), nodes, pool="p")
    c, notes = spares.heal(store, c, [n for n in nodes if n.id != "c"])
    assert notes == ["spare node c lost; let go",
                     "new spare node d (10.0.0.1) reserved; the next run warms it"]
    assert _held_nodes(store, "big") == ["a", "b"] and _spare_nodes(store, "big") == ["d"]


@pytest.mark.parametrize("backend, says", [("local", "the local pool has one node"),
                                           ("sim", "runs no processes")])
def test_spares_are_refused_where_no_other_node_could_run_the_job(
        backend: str, says: str) -> None:
    with pytest.raises(SpecError) as got:
        ClusterSpec.parse({"gpu": "cpu", "count": 2, "backend": backend, "spares": 1})
    assert [f for f, _ in got.value.problems] == ["spares"]
    assert says in got.value.problems[0][1]


def test_list_shows_the_spares_and_a_lost_one_in_the_health(store: Store) -> None:
    from gpufleet import views

    nodes = [_node("a"), _node("b"), _node("c")]
    c = clusters.launch(store, _spec("big", spare=1), nodes, pool="p")
    row = views.cluster_rows(store, [c], c.created_at, lambda _: nodes)[0]
    assert (row["spares"], row["health"], sorted(row["placements"])) == (["c"], "ok", ["a", "b"])
    row = views.cluster_rows(store, [c], c.created_at, lambda _: nodes[:2])[0]
    assert row["health"] == "degraded: spare node(s) c lost"
