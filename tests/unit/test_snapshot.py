"""`gpufleet.snapshot` (list read with stdlib sqlite3) and the store agree: the same columns as
store/models.py, the same schema version, the same rows as `views.cluster_rows`, and it steps
aside (None) whenever the store must be opened."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from gpufleet import cluster_row, snapshot, views
from gpufleet.store import Cluster, Job, Store
from gpufleet.store.db import SCHEMA_VERSION
from gpufleet.store.models import Base


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    return Store()


def _cluster(store: Store, name: str, status: str, **extra: object) -> Cluster:
    now = time.time()
    with store.session() as s:
        c = Cluster(name=name, gpu="cpu", count=2, nodes=1, network="pcie", disk_bytes=1 << 30,
                    backend="local", price_book="marketplace", usd_per_hour=1.25, status=status,
                    created_at=now - 100, started_at=now - 90,
                    stopped_at=now - 10 if status == "stopped" else None, scratch_dir="/tmp/x",
                    spec_json="{}", **extra)
        s.add(c)
    return c


def _job(store: Store, name: str, cluster: Cluster, status: str) -> None:
    with store.session() as s:
        s.add(Job(name=name, cluster_id=cluster.id, status=status, spec_json="{}",
                  job_dir="/tmp/j", world_size=2, created_at=time.time(), samples=0))


def test_it_reads_only_columns_the_models_define() -> None:
    assert snapshot.SCHEMA_VERSION == SCHEMA_VERSION
    for table, cols in snapshot.COLUMNS.items():
        assert set(cols) <= set(Base.metadata.tables[table].columns.keys()), table


def test_stopped_clusters_read_the_same_as_through_the_store(store: Store) -> None:
    a = _cluster(store, "alpha", "stopped", pool="ray-1", simulated=True)
    _job(store, "train-1", a, "failed")
    _job(store, "train-2", a, "succeeded")
    _cluster(store, "beta", "stopped", banked_usd=0.5, rate_since=time.time() - 50)
    now = time.time()
    quick = snapshot.cluster_rows(snapshot.state_path(), True, now)
    with store.read() as s:
        found = list(s.query(Cluster).order_by(Cluster.id))
    assert quick == views.cluster_rows(store, found, now, lambda c: [])
    assert quick is not None and all(tuple(r) == cluster_row.KEYS for r in quick)
    assert quick is not None and quick[0]["job"] == "train-2"
    assert snapshot.cluster_rows(snapshot.state_path(), False, now) == []  # none running


def test_it_steps_aside_when_the_store_must_answer(store: Store, tmp_path: Path) -> None:
    path = snapshot.state_path()
    assert snapshot.cluster_rows(tmp_path / "missing.db", False, time.time()) is None
    c = _cluster(store, "gamma", "stopped")
    _job(store, "live", c, "running")  # its supervisor may have died: reconcile first
    assert snapshot.cluster_rows(path, True, time.time()) is None


def test_a_running_cluster_goes_through_the_store(store: Store) -> None:
    _cluster(store, "delta", "running")  # its health needs the pool's devices
    assert snapshot.cluster_rows(snapshot.state_path(), False, time.time()) is None


def test_another_schema_version_goes_through_the_store(store: Store) -> None:
    path = snapshot.state_path()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    assert snapshot.cluster_rows(path, True, time.time()) is None


def test_only_a_running_clusters_health_asks_its_pool(store: Store) -> None:
    """`views.cluster_rows` asks for a pool's devices only for running clusters; a pool that
    cannot be reached is said so, not taken for healthy."""
    _cluster(store, "old", "stopped")
    _cluster(store, "live", "running")
    with store.read() as s:
        found = list(s.query(Cluster).order_by(Cluster.id))
    asked: list[str] = []

    def unreachable(c: Cluster) -> None:
        asked.append(c.name)

    rows = views.cluster_rows(store, found, time.time(), unreachable)
    assert asked == ["live"]
    assert [(r["name"], r["health"]) for r in rows] == [("old", "-"),
                                                      ("live", "unknown: pool unreachable")]
