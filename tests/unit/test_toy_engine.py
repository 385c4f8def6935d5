"""A third engine written only against `backends.base.Backend` and `backends.alloc.Allocating`,
registered for the test (a row in `kinds.CAPABILITIES`, an entry in `registry.ENGINES`): it is
added as a pool, allocates with a pending reason first, is provisioned through lifecycle's own
orchestration against a real SQLite store, shows in `gpufleet jobs`' rows while it queues,
loses a node and is healed by the policy, and is given back on stop. Nothing outside
`backends/` knows its name."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.backends import alloc, kinds, registry
from gpufleet.backends.adders import AddRequest, Registration
from gpufleet.backends.base import Prepared, RunRequest
from gpufleet.backends.driver_procs import DriverProcs
from gpufleet.errors import AllocationError
from gpufleet.lifecycle import clusters, engine_alloc, engine_heal, pool_setup, pools, provision
from gpufleet.pool.model import Device, Node
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Store

TOY = kinds.Capabilities(this_host=False, multi_node=True, elastic=False, ssh=False,
                         simulated=False, samples_devices=False, allocates=True)


def _node(name: str) -> Node:
    return Node(name, f"10.9.0.{name[1:]}", tuple(
        Device(id=f"gpu{i}", index=i, gpu="H100-SXM", memory_bytes=80 * 10**9)
        for i in range(2)), gpu_fabric="nvswitch", inter_fabric="infiniband",
        free_disk_bytes=1 << 40)


class ToyEngine(DriverProcs):
    """Grants whole free nodes in order; each new allocation is pending ("Quota") for its
    first look, then granted. `lose` marks a node failed, as a run would find it."""

    kind = "toy"
    capabilities = TOY
    engine_name = "Toy"
    alloc_word = "toy allocation"
    pids_here = True

    def __init__(self, names: list[str]):
        self.nodes = {n: _node(n) for n in names}
        self.held: dict[str, list[str]] = {}  # live allocation -> its nodes
        self.looks: dict[str, int] = {}
        self.cancelled: list[str] = []
        self.lost: set[str] = set()
        self.asks: list[alloc.Ask] = []  # in the order of their refs: t1, t2, ...
        self.busy_for_spares = False  # then an ask with spares waits in the queue for ever
        self.init_procs()

    # -- alloc.Allocating ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.kind

    @property
    def where(self) -> str:
        return "toy region"

    def discover(self) -> list[Node]:
        return [dataclasses.replace(n, healthy=n.id not in self.lost) for n in self.nodes.values()]

    def request(self, ask: alloc.Ask) -> tuple[str, str]:
        ref = f"t{len(self.looks) + 1}"
        self.looks[ref] = 0
        self.held[ref] = []
        self.asks.append(ask)
        return ref, f"{ask.nodes} x {ask.per_node} GPU(s)"

    def state(self, ref: str) -> alloc.AllocState:
        if ref not in self.held:
            return alloc.Ended("released")
        self.looks[ref] += 1
        if self.looks[ref] == 1:
            return alloc.Pending("Quota", "Quota (waiting for the toy quota)")
        if not self.held[ref]:
            ask = self.asks[int(ref[1:]) - 1]
            if ask.spares and self.busy_for_spares:
                return alloc.Pending("Resources", "Resources (waiting for nodes)")
            busy = {n for nodes in self.held.values() for n in nodes} | self.lost
            free = [n for n in self.nodes if n not in busy and n not in ask.exclude]
            if len(free) < ask.nodes + ask.spares:
                return alloc.Pending("Quota", "Quota (waiting for the toy quota)",
                                     never_clears=True)
            self.held[ref] = free[:ask.nodes + ask.spares]
        return alloc.Granted(tuple((n, tuple(range(2))) for n in self.held[ref]))

    def fail(self, node: str) -> None:
        """The node fails: an allocation with spares outlives it without that node (as
        Slurm's --no-kill does); one without keeps listing it, as the heal finds it."""
        self.lost.add(node)
        for ref, nodes in self.held.items():
            if self.asks[int(ref[1:]) - 1].spares and node in nodes:
                nodes.remove(node)

    def cancel(self, ref: str) -> None:
        self.cancelled.append(ref)
        self.held.pop(ref, None)

    def queued(self) -> list[alloc.Queued]:
        return [alloc.Queued(ref, "PENDING" if not nodes else "RUNNING",
                             "" if nodes else "Quota", ",".join(nodes), pending=not nodes)
                for ref, nodes in self.held.items()]

    def dry_run(self, ask: alloc.Ask | None, ref: str, node_ids: list[str],
                job_dir: Path) -> list[str]:
        return [f"toy run {ref} on {n}" for n in node_ids]

    def shell(self, ref: str, node_id: str, argv: list[str],
              env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        return ["toy-shell", ref, node_id, *argv], env

    # -- base.Backend: its runs are local processes, as Slurm's driver is ------------------------
    def prepare(self, run: RunRequest) -> Prepared:
        return Prepared(["true"], {})







    def lost_nodes(self, job_dir: Path) -> set[str]:
        return set(self.lost)

    def node_lost(self, code: int, lines: list[str]) -> str | None:
        return None

    def report_host(self) -> str:
        return "127.0.0.1"


def _add(r: AddRequest) -> Registration:
    r.claim()
    return Registration(None, {"region": "r1"}, "toy region r1, 3 nodes", 3, 6)


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ToyEngine]:
    engine = ToyEngine(["n1", "n2", "n3"])
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(kinds.CAPABILITIES, "toy", TOY)
    monkeypatch.setitem(registry.ENGINES, "toy", registry.Engine(
        lambda _o: engine, lambda _a, s: f"toy region {s['region']}", _add))
    monkeypatch.setattr(engine_alloc.time, "sleep", lambda _s: None)  # polls a plain object
    yield engine


def test_the_toy_engine_is_an_engine_that_allocates(toy: ToyEngine) -> None:
    assert isinstance(toy, alloc.Allocating)
    assert isinstance(registry.open_backend("toy", "p", None, "{}"), alloc.Allocating)
    assert "toy" in registry.addable() and kinds.capabilities("toy").allocates


def test_a_toy_cluster_is_granted_after_its_pending_reason_healed_and_given_back(
        toy: ToyEngine, tmp_path: Path) -> None:
    store = Store(url=f"sqlite:///{tmp_path}/s.db")
    added = pool_setup.add(store, "toy", "p", None, [], None, True)
    assert added.summary == "toy region r1, 3 nodes"
    assert pools.listing(store, "p")[0]["where"] == "toy region r1"

    said: list[str] = []
    spec = ClusterSpec.parse(provision.with_pool(store, {
        "name": "c", "gpu": "H100", "count": 4, "nodes": 2, "network": "infiniband"}))
    assert spec.backend == "toy"  # the default pool's kind, accepted as a registered one
    cluster = provision.provision(store, spec, None, say=said.append)
    assert said[0] == "toy allocation t1 submitted (2 x 2 GPU(s))"
    assert said[1].startswith("toy allocation t1 pending: Quota (waiting for the toy quota)")
    assert said[2] == "toy allocation t1 running on n1, n2"
    assert (cluster.engine_ref, cluster.nodes, cluster.count) == ("t1", 2, 4)
    assert [p.node_id for p in clusters.placements(store, cluster)] == ["n1", "n2"]

    toy.lost.add("n2")  # the run lost n2: the same size again without it, on n1 and n3
    healed, notes = engine_heal.reallocate(store, toy, cluster, {"n2"}, said.append)
    assert toy.cancelled == ["t1"]
    assert notes == ["node(s) n2 lost with toy allocation t1; new allocation: toy allocation "
                     "t2 on n1, n3 (replacement nodes, not Toy's requeue)"]
    assert [p.node_id for p in clusters.placements(store, healed)] == ["n1", "n3"]
    assert (healed.engine_ref, healed.nodes, healed.count) == ("t2", 2, 4)

    toy.lost.add("n3")  # no third node left: the same size never clears, so fewer nodes
    smaller, notes = engine_heal.reallocate(store, toy, healed, {"n3"}, said.append)
    assert notes[0].endswith("; going on with 1 node(s)")
    assert (smaller.engine_ref, smaller.nodes, smaller.count) == ("t4", 1, 2)
    assert toy.cancelled == ["t1", "t2", "t3"]  # t3: the same size, refused as never clearing
    assert [p.node_id for p in clusters.placements(store, smaller)] == ["n1"]

    clusters.stop(store, "c")
    assert toy.cancelled[-1] == "t4" and toy.held == {}


def test_a_toy_allocation_still_pending_is_listed_with_the_engine_word(
        toy: ToyEngine, tmp_path: Path) -> None:
    store = Store(url=f"sqlite:///{tmp_path}/s.db")
    pool_setup.add(store, "toy", "p", None, [], None, True)
    toy.request(alloc.Ask("other", "H100-SXM", 2, 1))
    rows = engine_alloc.queue_rows(store, [], 0.0)
    assert [(r["name"], r["status"], r["reason"]) for r in rows] == [
        ("(toy t1)", "pending in Toy", "Quota")]
    assert rows[0]["allocation"]["engine"] == "Toy"


def test_a_heal_that_lost_no_node_keeps_the_allocation(toy: ToyEngine, tmp_path: Path) -> None:
    store = Store(url=f"sqlite:///{tmp_path}/s.db")
    pool_setup.add(store, "toy", "p", None, [], None, True)
    spec = ClusterSpec.parse(provision.with_pool(store, {"name": "k", "gpu": "H100", "count": 2,
                                                         "nodes": 1}))
    cluster = provision.provision(store, spec, None, say=lambda _t: None)
    assert engine_heal.reallocate(store, toy, cluster, set(), lambda _t: None) == (cluster, [])
    assert toy.cancelled == []
    with pytest.raises(AllocationError, match="could never hold this"):
        provision.provision(store, spec.model_copy(update={"name": "big", "count": 8,
                                                           "nodes": 4}), None)


def test_a_lost_node_is_replaced_by_a_spare_of_the_same_allocation(
        toy: ToyEngine, tmp_path: Path) -> None:
    """`--spares 1` on an engine that allocates: the spare is granted in the cluster's own
    allocation, listed and billed; a lost node is replaced by it with no new allocation (none
    cancelled, none asked), billed for what is left; the next loss, with no spare left, asks
    the engine again, for the spare too."""
    store = Store(url=f"sqlite:///{tmp_path}/s.db")
    pool_setup.add(store, "toy", "p", None, [], None, True)
    said: list[str] = []
    spec = ClusterSpec.parse(provision.with_pool(store, {
        "name": "s", "gpu": "H100", "count": 4, "nodes": 2, "spares": 1}))
    with pytest.raises(AllocationError, match=r"could never hold this.* \(the cluster's 2 "
                       r"and 2 spare\) \[pool p\]"):
        provision.provision(store, spec.model_copy(update={"spares": 2}), None)
    assert toy.asks == []  # refused before anything was asked
    cluster = provision.provision(store, spec, None, say=said.append)
    assert (toy.asks[0].nodes, toy.asks[0].spares) == (2, 1)
    own = [p.node_id for p in clusters.placements(store, cluster)]
    spare = [p.node_id for p in clusters.spares(store, cluster)]
    assert len(own) == 2 and len(spare) == 1 and sorted(own + spare) == ["n1", "n2", "n3"]
    assert (cluster.nodes, cluster.spares, cluster.count, cluster.billed_devices) == (2, 1, 4, 6)
    rate = cluster.usd_per_hour
    assert rate > 0

    toy.fail(own[0])
    healed, notes = engine_heal.reallocate(store, toy, cluster, {own[0]}, said.append)
    assert notes == [f"node {own[0]} lost; replaced by spare node {spare[0]} "
                     f"(10.9.0.{spare[0][1:]})",
                     "toy allocation t1 kept: no new allocation, no wait in Toy's queue; no new "
                     "spare until a heal asks Toy for a new allocation"]
    assert toy.cancelled == [] and len(toy.asks) == 1
    assert sorted(p.node_id for p in clusters.placements(store, healed)) == \
        sorted([own[1], spare[0]])
    assert clusters.spares(store, healed) == []
    assert (healed.engine_ref, healed.nodes, healed.spares, healed.count) == ("t1", 2, 0, 4)
    assert healed.usd_per_hour == pytest.approx(rate * 4 / 6)

    toy.fail(own[1])  # no spare left: the engine is asked again: with the spare (never asked:
    # 3 nodes but the one lost now could never hold it), the same size (never clears), fewer
    again, notes = engine_heal.reallocate(store, toy, healed, {own[1]}, said.append)
    assert [(a.nodes, a.spares) for a in toy.asks] == [(2, 1), (2, 0), (1, 0)]
    assert notes[0].endswith("; going on with 1 node(s)"), notes
    assert (again.nodes, again.spares, again.count) == (1, 0, 2)
    assert [p.node_id for p in clusters.placements(store, again)] == [spare[0]]
    clusters.stop(store, "s")
    assert toy.held == {}


def _one_node_and_its_spare_lost(toy: ToyEngine, tmp_path: Path,
                                 name: str) -> tuple[Store, Cluster, str, str]:
    """A 1-node cluster with 1 spare, granted by the toy; then both its node and its spare
    fail, so no spare is alive to take the node's place. The store, the cluster and the two."""
    store = Store(url=f"sqlite:///{tmp_path}/s.db")
    pool_setup.add(store, "toy", "p", None, [], None, True)
    spec = ClusterSpec.parse(provision.with_pool(store, {
        "name": name, "gpu": "H100", "count": 2, "nodes": 1, "spares": 1}))
    cluster = provision.provision(store, spec, None, say=lambda _t: None)
    own = clusters.placements(store, cluster)[0].node_id
    spare = clusters.spares(store, cluster)[0].node_id
    toy.fail(spare)
    toy.fail(own)
    return store, cluster, own, spare


def test_a_new_allocation_after_a_heal_holds_the_spares_again(
        toy: ToyEngine, tmp_path: Path) -> None:
    """A lost node with no spare alive in the allocation (the spare failed first): the new
    allocation asks for the cluster's spares again and records them as spares."""
    toy.nodes.update({n: _node(n) for n in ("n4", "n5")})
    store, cluster, own, spare = _one_node_and_its_spare_lost(toy, tmp_path, "t")
    healed, notes = engine_heal.reallocate(store, toy, cluster, {own}, lambda _t: None)
    assert toy.cancelled == ["t1"] and "new allocation: toy allocation t2" in notes[0], notes
    assert (healed.engine_ref, healed.nodes, healed.spares, healed.billed_devices) == \
        ("t2", 1, 1, 4)
    left = {p.node_id for p in clusters.placements(store, healed)} | \
        {p.node_id for p in clusters.spares(store, healed)}
    assert len(left) == 2 and not left & {own, spare}
    clusters.stop(store, "t")


def test_a_heal_waits_only_briefly_for_the_spares_again(
        toy: ToyEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocation with the spares again is asked first, but the job comes first: one the
    engine keeps queued is cancelled after SPARES_WAIT_S and the job's own size is asked."""
    monkeypatch.setattr(engine_heal, "SPARES_WAIT_S", 0.0)
    toy.nodes.update({"n4": _node("n4")})
    store, cluster, own, _spare = _one_node_and_its_spare_lost(toy, tmp_path, "q")
    toy.busy_for_spares = True  # no spare alive: a new allocation, whose spares stay queued
    said: list[str] = []
    healed, notes = engine_heal.reallocate(store, toy, cluster, {own}, said.append)
    assert [(a.nodes, a.spares) for a in toy.asks] == [(1, 1), (1, 1), (1, 0)]
    assert toy.cancelled == ["t1", "t2"]  # the old allocation, then the one still queued
    assert not any("t2 running" in t for t in said), said
    assert (healed.engine_ref, healed.nodes, healed.spares) == ("t3", 1, 0)
    assert "new allocation: toy allocation t3" in notes[0], notes
    clusters.stop(store, "q")
