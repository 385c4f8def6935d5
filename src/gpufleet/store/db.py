"""The SQLite store under $GPUFLEET_HOME, in WAL mode, with write transactions that serialize.

Allocation reads the reservations and writes new ones in one `BEGIN IMMEDIATE` transaction, so
two `gpufleet launch` processes started at the same moment take turns instead of both seeing the
same devices free; the unique (node, device) key backs that up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.errors import ConflictError
from gpufleet.store.models import Base


def gpufleet_home() -> Path:
    """The state folder: $GPUFLEET_HOME or ~/.gpufleet, created owner-only (0700)."""
    home = Path(os.environ.get("GPUFLEET_HOME") or Path.home() / ".gpufleet").expanduser()
    try:
        for folder in (home, home / "jobs", home / "clusters"):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            folder.chmod(0o700)
    except OSError as exc:
        raise ConflictError(f"GPUFLEET_HOME: cannot use {home} as a private state folder: "
                            f"{exc.strerror or exc}") from None
    return home


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy's BEGIN below control transactions instead of the sqlite3 module.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    # Reads take no write lock (WAL lets them run beside a writer); writes take it up front, so
    # two writers queue on busy_timeout instead of failing when one upgrades a read lock.
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("readonly") else
                         "BEGIN IMMEDIATE")


class Store:
    """A handle on the database. `session()` is one transaction, committed on normal exit."""

    def __init__(self, url: str | None = None):
        if url is None:
            path = gpufleet_home() / "state.db"
            url = f"sqlite:///{path}"
            if not path.exists():
                path.touch(mode=0o600)
            path.chmod(0o600)
        self.url = url
        self.engine: Engine = create_engine(url)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _sqlite_begin)
        Base.metadata.create_all(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._reads = sessionmaker(self.engine.execution_options(readonly=True),
                                   expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A write transaction (serialized with every other writer)."""
        with self._sessions() as s, s.begin():
            yield s

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only transaction: a consistent snapshot that never waits for writers."""
        with self._reads() as s, s.begin():
            yield s

    def close(self) -> None:
        self.engine.dispose()
