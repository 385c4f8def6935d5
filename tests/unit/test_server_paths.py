"""What a server serving many requests relies on, against a real SQLite file: names picked for
jobs and clusters never refuse a request because another has them, the kept allocator index
sees reservations it did not make, and a user's job list stays bounded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.errors import AllocationError, ConflictError
from gpufleet.lifecycle import clusters, listing, queued
from gpufleet.lifecycle.accounts import Identity
from gpufleet.pool.model import Device, Node
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.status import ClusterStatus, QueueStatus
from gpufleet.store import Cluster, QueuedJob, Reservation, Store

ME = Identity("ann", "ml", False)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def _nodes(n: int = 3, pool: str = "p") -> list[Node]:
    return [Node(f"{pool}-{i}", f"{pool}-{i}", tuple(
        Device(id=f"gpu{k}", index=k, gpu="H100-SXM", memory_bytes=1, simulated=True)
        for k in range(8)), gpu_fabric="nvswitch", inter_fabric="infiniband")
        for i in range(n)]


def _sim(count: int, nodes: int | None = None, name: str | None = None) -> ClusterSpec:
    return ClusterSpec.parse({"name": name, "gpu": "H100", "count": count, "nodes": nodes,
                              "backend": "sim", "pool": "p"})


def _need() -> queued.Need:
    return queued.Need("local", "cpu", 1, None, 0.0, None)


def _job(tmp_path: Path, name: str) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return JobSpec.parse({"script": str(script), "name": name})


def test_a_picked_job_name_taken_meanwhile_is_picked_again(store: Store, tmp_path: Path) -> None:
    spec = _job(tmp_path, "train-0001")
    queued.enqueue(store, spec, ME, _need(), None, time.time())
    with pytest.raises(ConflictError, match="already exists"):  # a name the user gave
        queued.enqueue(store, spec, ME, _need(), None, time.time())
    again = queued.enqueue(store, spec, ME, _need(), None, time.time(), picked=True)
    assert again.name != "train-0001" and again.name.startswith("train-")
    assert again.name in again.spec_json  # the job runs under the name it was queued with


def test_a_picked_cluster_name_of_a_running_cluster_is_picked_again(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    names = iter(["cluster-aaaa", "cluster-aaaa", "cluster-bbbb"])
    monkeypatch.setattr(clusters, "new_name", lambda _prefix: next(names))
    nodes = _nodes()
    first = clusters.launch(store, _sim(1), nodes, pool="p")
    second = clusters.launch(store, _sim(1), nodes, pool="p")
    assert (first.name, second.name) == ("cluster-aaaa", "cluster-bbbb")
    with pytest.raises(ConflictError, match="already exists"):  # a name the user gave
        clusters.launch(store, _sim(1, name="cluster-aaaa"), nodes, pool="p")


def _reserve_elsewhere(store: Store, node: str, devices: range) -> None:
    """Devices reserved as another process would: straight into the store, not through this
    process's kept index."""
    with store.session() as s:
        c = Cluster(name="theirs", gpu="H100-SXM", count=len(devices), nodes=1,
                    network="nvswitch", disk_bytes=0, backend="sim", status=ClusterStatus.RUNNING,
                    created_at=0.0, started_at=0.0, scratch_dir="/nonexistent", spec_json="{}",
                    pool="p", simulated=True)
        s.add(c)
        s.flush()
        for k in devices:
            s.add(Reservation(cluster_id=c.id, pool="p", node_id=node, address=node,
                              device_id=f"gpu{k}", device_index=k))


def test_the_kept_index_sees_what_others_reserved_and_freed(store: Store) -> None:
    nodes = _nodes()  # one list for every launch, as a sim pool's backend hands out
    a = clusters.launch(store, _sim(8), nodes, pool="p")
    _reserve_elsewhere(store, "p-1", range(8))
    b = clusters.launch(store, _sim(8), nodes, pool="p")
    held = {p.node_id for c in (a, b) for p in clusters.placements(store, c)}
    assert held == {"p-0", "p-2"}  # not p-1, which the index never saw taken
    with pytest.raises(AllocationError):
        clusters.launch(store, _sim(1), nodes, pool="p")
    clusters.stop(store, "theirs")  # freed by another process
    c = clusters.launch(store, _sim(8), nodes, pool="p")
    assert [p.node_id for p in clusters.placements(store, c)] == ["p-1"]
    clusters.stop(store, a.name)
    clusters.stop(store, c.name)
    big = clusters.launch(store, _sim(16, nodes=2), nodes, pool="p")
    assert sorted(p.node_id for p in clusters.placements(store, big)) == ["p-0", "p-1"]


def test_a_users_list_shows_every_queued_job_and_a_bounded_history(store: Store,
                                                                    tmp_path: Path) -> None:
    now = time.time()
    for i in range(12):
        queued.enqueue(store, _job(tmp_path, f"j{i}"), ME, _need(), None, now)
    with store.session() as s:
        for e in s.query(QueuedJob).filter(QueuedJob.name.in_([f"j{i}" for i in range(8)])):
            e.status, e.left_at = QueueStatus.CANCELLED, now - int(e.name[1:])
    rows = listing.table(store, ME, now, limit=5)
    assert [r["name"] for r in rows if r["status"] == "queued"] == [f"j{i}" for i in range(8, 12)]
    assert [r["name"] for r in rows if r["status"] == "cancelled"] == [f"j{i}" for i in range(5)]
