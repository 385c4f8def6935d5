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
