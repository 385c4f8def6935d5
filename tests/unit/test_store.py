"""The SQLite store: tables, the reservation key, and owner-only files."""

from __future__ import annotations

import sqlite3
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError

from gpufleet.errors import ConflictError
from gpufleet.lifecycle import clusters
from gpufleet.pool.model import Device, Node
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Reservation, Store, gpufleet_home
from gpufleet.store.db import _to_wal


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


class _Watched:
    """A real cursor whose refusals are seen: the test waits on the first one, not on a time."""

    def __init__(self, cur: sqlite3.Cursor):
        self.cur, self.refused = cur, threading.Event()

    def execute(self, sql: str) -> Any:
        try:
            return self.cur.execute(sql)
        except sqlite3.OperationalError:
            self.refused.set()
            raise


def _held_new_file(path: Path) -> sqlite3.Connection:
    """A connection in the middle of a write on a file still in its first (rollback) journal,
    as a first command's migration is when a second opens the same new store."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("CREATE TABLE t (x)")
    return holder


def test_wal_is_set_once_a_connection_holding_a_new_file_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    holder = _held_new_file(path)
    other = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    cur = _Watched(other.cursor())
    done: list[str] = []

    def switch() -> None:
        _to_wal(cur, timeout_s=120)
        done.append("wal")

    t = threading.Thread(target=switch)
    t.start()
    assert cur.refused.wait(60), "SQLite refused nothing: the case this guards did not happen"
    holder.execute("COMMIT")  # SQLite said "locked" at once; the switch waits for this
    t.join(120)
    assert done == ["wal"]
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    holder.close()
    other.close()


def test_wal_gives_up_with_sqlites_error_when_the_file_stays_held(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    holder = _held_new_file(path)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _to_wal(other.cursor(), timeout_s=0.2)
    holder.close()
    other.close()


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
