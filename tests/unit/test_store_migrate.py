"""State files from older versions: new columns are added in place; a pre-release file (no
schema version) is kept aside and a new one started."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from gpufleet.store import Job, Store
from gpufleet.store.db import SCHEMA_VERSION


def test_missing_column_is_added_and_old_rows_read_as_unknown(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    Store(url=f"sqlite:///{db}").close()
    with sqlite3.connect(db) as conn:  # an older version's jobs table: no first_step column
        conn.execute("ALTER TABLE jobs DROP COLUMN first_step")
        conn.execute("DROP TABLE alembic_version")  # and, like every older version, no Alembic
        conn.execute("INSERT INTO clusters (name, gpu, count, nodes, network, disk_bytes, backend,"
                     " usd_per_hour, status, created_at, scratch_dir, spec_json) VALUES "
                     "('c', 'cpu', 1, 1, 'pcie', 1, 'local', 0, 'running', 0, '/x', '{}')")
        conn.execute("INSERT INTO jobs (name, cluster_id, status, spec_json, job_dir, world_size,"
                     " created_at, samples) VALUES ('old', 1, 'succeeded', '{}', '/x', 1, 0, 0)")
    conn.close()
    store = Store(url=f"sqlite:///{db}")
    with store.read() as s:
        job = s.query(Job).one()
    assert job.name == "old" and job.first_step is None
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    store.close()


def test_prerelease_state_file_is_kept_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path))
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute("CREATE TABLE clusters (id INTEGER PRIMARY KEY, name TEXT UNIQUE)")
        conn.execute("INSERT INTO clusters (name) VALUES ('old')")
    conn.close()
    store = Store()
    with store.read() as s:
        assert s.execute(text("SELECT count(*) FROM clusters")).scalar() == 0
    store.close()
    [aside] = list(tmp_path.glob(f"state.db.pre-{SCHEMA_VERSION}-*"))
    with sqlite3.connect(aside) as conn:
        assert conn.execute("SELECT name FROM clusters").fetchall() == [("old",)]
    conn.close()
    assert "pre-release" in capsys.readouterr().err


def test_version_1_reservations_are_rekeyed_by_pool_and_kept(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with sqlite3.connect(db) as conn:  # the version-1 layout of the two tables involved
        conn.execute("CREATE TABLE clusters (id INTEGER PRIMARY KEY, name VARCHAR(64), gpu "
                     "VARCHAR(32), count INTEGER, nodes INTEGER, network VARCHAR(16), disk_bytes "
                     "INTEGER, backend VARCHAR(16), price_book VARCHAR(32), usd_per_hour FLOAT, "
                     "status VARCHAR(16), created_at FLOAT, started_at FLOAT, stopped_at FLOAT, "
                     "scratch_dir TEXT, spec_json TEXT, for_job VARCHAR(64))")
        conn.execute("CREATE TABLE reservations (id INTEGER PRIMARY KEY, cluster_id INTEGER "
                     "REFERENCES clusters(id), node_id VARCHAR(64), address VARCHAR(64), device_id "
                     "VARCHAR(32), device_index INTEGER, UNIQUE (node_id, device_id))")
        conn.execute("INSERT INTO clusters (name, gpu, count, nodes, network, disk_bytes, backend,"
                     " usd_per_hour, status, created_at, scratch_dir, spec_json) VALUES "
                     "('c', 'cpu', 1, 1, 'pcie', 1, 'local', 0, 'running', 0, '/x', '{}')")
        conn.execute("INSERT INTO reservations (cluster_id, node_id, address, device_id, "
                     "device_index) VALUES (1, 'local', '127.0.0.1', 'cpu0', 0)")
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    store = Store(url=f"sqlite:///{db}")
    with store.session() as s:
        rows = s.execute(text("SELECT pool, node_id, device_id FROM reservations")).all()
        assert [tuple(r) for r in rows] == [("local", "local", "cpu0")]
        # the same node and device name on another pool is now allowed; on the same pool not
        s.execute(text("INSERT INTO reservations (cluster_id, node_id, address, device_id, "
                       "device_index, pool) VALUES (1, 'local', 'x', 'cpu0', 0, 'ray')"))
    with pytest.raises(Exception, match="UNIQUE"), store.session() as s:
        s.execute(text("INSERT INTO reservations (cluster_id, node_id, address, device_id, "
                       "device_index, pool) VALUES (1, 'local', 'x', 'cpu0', 0, 'local')"))
    store.close()
