"""`list` read straight from the state file with the stdlib `sqlite3` module, read-only.

Opening the store (SQLAlchemy, its models, the schema check) costs half a second of CPU, more
than everything else `gpufleet list` does. When there is nothing for the store's upkeep to do
and no pool to ask about devices, the rows come from here; otherwise `cluster_rows` returns
None and the caller reads through the store as before. `store/models.py` stays the one schema:
`COLUMNS` names what is read here, and tests/unit/test_snapshot.py checks both against it and
against the store's own rows.

Served here: no clusters, or only stopped ones (`list --all`), with no job still active. A
running cluster needs its pool's devices for its health, and an active job may need
`reconcile.reconcile` (its supervisor may have died): those go through the store.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpufleet import cluster_row
from gpufleet.home import checked_home
from gpufleet.status import CLUSTER_ACTIVE, JOB_ACTIVE

SCHEMA_VERSION = 2  # store.db.SCHEMA_VERSION, which this reader understands
COLUMNS = {
    "clusters": ("id", *cluster_row.COLUMNS),
    "jobs": ("id", "name", "status", "cluster_id"),
    "reservations": ("cluster_id",),
    "queue": ("status",),
}


def state_path() -> Path:
    """Where `store.Store()` keeps its state (`$GPUFLEET_HOME/state.db`), found without
    creating anything; a state folder the store would refuse is refused here too (StateError).
    A state file that cannot be read is left to the store, which says why in one line."""
    return checked_home() / "state.db"


def _marks(n: int) -> str:
    return ",".join("?" * n)


T = TypeVar("T")


class Declined(Exception):
    """A reader met something it cannot vouch for: the store must answer."""


def read_only(path: Path, reader: Callable[[sqlite3.Connection], T | None]) -> T | None:
    """`reader` on the state file opened read-only, or None when the store must answer: no
    state file yet, a column or table this version does not know, or the reader declined."""
    if not path.is_file() or os.environ.get("GPUFLEET_DB"):  # the state is in another database
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        return reader(db)
    except (sqlite3.Error, Declined):
        return None
    finally:
        db.close()


def cluster_rows(path: Path, every: bool, now: float) -> list[dict[str, Any]] | None:
    """`list`'s rows (every cluster, or only running ones), or None when the store must be
    opened: no state file yet, another schema, an active job, or a running cluster to show."""
    return read_only(path, lambda db: _rows(db, every, now))


def _rows(db: sqlite3.Connection, every: bool, now: float) -> list[dict[str, Any]] | None:
    if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
        return None
    db.execute("BEGIN")  # one snapshot for every query below
    active_jobs = db.execute(f"SELECT count(*) FROM jobs WHERE status IN ({_marks(len(JOB_ACTIVE))})",
                             [str(s) for s in JOB_ACTIVE]).fetchone()[0]
    if active_jobs:
        return None
    if db.execute("SELECT count(*) FROM queue WHERE status = 'queued'").fetchone()[0]:
        return None  # queued jobs: `stop --all` cancels them, `list` goes through the store
    cols = COLUMNS["clusters"]
    q = f"SELECT {', '.join(cols)} FROM clusters"
    if not every:
        q += f" WHERE status IN ({_marks(len(CLUSTER_ACTIVE))})"
    found = [dict(zip(cols, r, strict=True)) for r in
             db.execute(q + " ORDER BY id", [] if every else [str(s) for s in CLUSTER_ACTIVE])]
    if any(c["status"] in CLUSTER_ACTIVE for c in found):
        return None
    if not found:
        return []
    held = db.execute("SELECT count(*) FROM reservations WHERE cluster_id IN "
                      f"({_marks(len(found))})", [c["id"] for c in found]).fetchone()[0]
    if held:  # a stopped cluster holds nothing; if one does, the store knows better
        return None
    rows = []
    for c in found:
        job = db.execute("SELECT name, status FROM jobs WHERE cluster_id = ? ORDER BY id DESC "
                         "LIMIT 1", [c["id"]]).fetchone()
        stored = cluster_row.Stored(**{k: v for k, v in c.items() if k != "id"})
        rows.append(cluster_row.row(stored, {}, (job[0], job[1]) if job else None, "-", now))
    return rows
