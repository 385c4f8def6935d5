"""The SQLite store: tables, the reservation key, and owner-only files."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError

from gpufleet.errors import ConflictError
from gpufleet.lifecycle import clusters
from gpufleet.pool.model import Device, Node
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Reservation, Store, gpufleet_home


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def add_cluster(store: Store, name: str = "llama") -> int:
    with store.session() as s:
        c = Cluster(name=name, gpu="cpu", count=2, nodes=1, network="pcie", disk_bytes=10**9,
                    backend="local", price_book=None, usd_per_hour=0.0, status="running",
                    created_at=1_000.0, scratch_dir="/tmp/x", spec_json="{}")
        s.add(c)
        s.flush()
        return c.id


def reserve(store: Store, cluster_id: int, node: str, device: str, index: int) -> None:
    with store.session() as s:
        s.add(Reservation(cluster_id=cluster_id, node_id=node, address="127.0.0.1", device_id=device,
                          device_index=index))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def test_store_creates_tables(store: Store, tmp_path: Path) -> None:
    assert (tmp_path / "s.db").is_file()
    tables = set(inspect(store.engine).get_table_names())
    assert {"clusters", "reservations", "jobs", "job_events", "metrics"} <= tables


def test_store_uses_wal(store: Store) -> None:
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_session_commits_on_normal_exit(store: Store) -> None:
    cid = add_cluster(store)
    with store.session() as s:
        assert s.scalar(select(Cluster.name).where(Cluster.id == cid)) == "llama"


def test_session_rolls_back_on_error(store: Store) -> None:
    with pytest.raises(RuntimeError), store.session() as s:
        s.add(Cluster(name="doomed", gpu="cpu", count=1, nodes=1, network="pcie", disk_bytes=1,
                      backend="local", status="pending", created_at=1.0, scratch_dir="", spec_json="{}"))
        s.flush()
        raise RuntimeError("boom")
    with store.session() as s:
        assert s.scalar(select(Cluster).where(Cluster.name == "doomed")) is None


def test_same_device_cannot_be_reserved_twice(store: Store) -> None:
    a, b = add_cluster(store, "a"), add_cluster(store, "b")
    reserve(store, a, "local", "gpu0", 0)
    with pytest.raises(IntegrityError):
        reserve(store, b, "local", "gpu0", 0)
    with store.session() as s:
        held = s.scalars(select(Reservation)).all()
        assert [(r.cluster_id, r.node_id, r.device_id) for r in held] == [(a, "local", "gpu0")]


def test_same_device_id_on_other_node_or_other_device_is_fine(store: Store) -> None:
    a = add_cluster(store)
    reserve(store, a, "local", "gpu0", 0)
    reserve(store, a, "other", "gpu0", 0)
    reserve(store, a, "local", "gpu1", 1)
    with store.session() as s:
        assert len(s.scalars(select(Reservation)).all()) == 3


def test_reservation_needs_an_existing_cluster(store: Store) -> None:
    with pytest.raises(IntegrityError):
        reserve(store, 999, "local", "gpu0", 0)


def _local_node() -> Node:
    cpus = tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=2**30) for i in range(4))
    return Node(id="local", address="127.0.0.1", devices=cpus, free_disk_bytes=10**12)


def test_running_cluster_names_unique_but_reusable_after_stop(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    spec = ClusterSpec.parse({"gpu": "cpu", "count": 1, "name": "dup"})
    first = clusters.launch(store, spec, [_local_node()])
    with pytest.raises(ConflictError, match="name: a cluster named 'dup' already exists"):
        clusters.launch(store, spec, [_local_node()])
    clusters.stop(store, "dup")
    second = clusters.launch(store, spec, [_local_node()])
    assert second.id != first.id
    assert clusters.get(store, "dup").id == second.id  # the running one, not the history
    clusters.stop(store, "dup", cluster_id=first.id)  # the old one is already stopped: no-op
    assert clusters.get(store, "dup").status == "running"


def test_gpufleet_home_from_env_is_created_owner_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "deep" / "home"
    monkeypatch.setenv("GPUFLEET_HOME", str(home))
    assert gpufleet_home() == home
    assert home.is_dir()
    assert mode(home) == 0o700


def test_gpufleet_home_uses_an_existing_private_folder_as_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only folders gpufleet creates are chmod-ed: an existing one no one else can write to is
    # the owner's to set (it used to be forced to 0700, which locked a shared 1777 folder).
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    monkeypatch.setenv("GPUFLEET_HOME", str(home))
    gpufleet_home()
    assert mode(home) == 0o755
    assert mode(home / "jobs") == 0o700  # made by gpufleet


def test_gpufleet_home_defaults_under_user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert gpufleet_home() == tmp_path / ".gpufleet"
    assert mode(tmp_path / ".gpufleet") == 0o700


def test_default_store_file_is_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    store = Store()
    try:
        db = tmp_path / "home" / "state.db"
        assert store.url == f"sqlite:///file:{db}?mode=rw&uri=true"  # never creates the file
        assert mode(db) == 0o600
        add_cluster(store)  # a write creates the WAL side files
        sides = sorted((tmp_path / "home").glob("state.db-*"))
        assert sides, "WAL mode keeps state.db-wal/-shm while connected"
        for side in sides:
            assert mode(side) == 0o600, side
    finally:
        store.close()


def test_default_store_file_mode_restored_if_loosened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    Store().close()
    db = tmp_path / "home" / "state.db"
    db.chmod(0o644)
    Store().close()
    assert mode(db) == 0o600
