"""Schema migrations with Alembic, run in place when a store is opened (`migrate`).

Three kinds of store meet `migrate`:
- one at the newest revision (its `alembic_version` says so): nothing to do, and Alembic is not
  even imported, so opening a store stays cheap;
- an empty database: the tables are made from the models and stamped with the newest revision
  (Alembic's "create from scratch, then stamp");
- a state file of a version from before Alembic (no `alembic_version`, SQLite schema 2): it is
  brought to the baseline revision by the fix-ups those versions used (`legacy.py`: tables and
  columns they added in place, the reservations' key), stamped `0001`, and upgraded from there.
A store behind the newest revision is upgraded by `alembic upgrade head` on the same
connection, inside the same write transaction, so two processes opening it take turns.

A new change to the schema is a new file in `versions/` (its `down_revision` the previous
head) and a new `HEAD` here; `tests/unit/test_migrations.py` checks that a store upgraded from
every earlier revision ends with exactly the tables and columns of the models.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from gpufleet.store.migrations import legacy
from gpufleet.store.models import Base

HEAD = "0006"  # the newest revision in versions/
BASELINE = "0001"  # the schema of the versions before Alembic (SQLite schema 2)
TABLE = "alembic_version"


def current(conn: Connection) -> str | None:
    """The store's revision; None when it has no `alembic_version` table (or no row)."""
    if TABLE not in inspect(conn).get_table_names():
        return None
    return conn.execute(text(f"SELECT version_num FROM {TABLE}")).scalar()


def _alembic(conn: Connection, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    cfg.attributes["connection"] = conn
    getattr(command, action)(cfg, revision)


def migrate(conn: Connection) -> str:
    """Bring the store on `conn` (in a write transaction) to `HEAD`; what was done, in a word:
    "current", "created", "upgraded"."""
    at = current(conn)
    if at == HEAD:
        return "current"
    if at is None:
        if not inspect(conn).get_table_names():
            Base.metadata.create_all(conn)
            _alembic(conn, "stamp", HEAD)
            return "created"
        legacy.to_baseline(conn)
        _alembic(conn, "stamp", BASELINE)
    _alembic(conn, "upgrade", HEAD)
    return "upgraded"
