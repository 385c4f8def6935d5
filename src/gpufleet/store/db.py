"""The SQLite store under $GPUFLEET_HOME, in WAL mode, with write transactions that serialize.

Allocation reads the reservations and writes new ones in one `BEGIN IMMEDIATE` transaction, so
two `gpufleet launch` processes started at the same moment take turns instead of both seeing the
same devices free; the unique (pool, node, device) key backs that up. A team server's store can
be a PostgreSQL database instead (`Store("postgresql://...")`), where an advisory lock does what
BEGIN IMMEDIATE does here: `store.postgres` says how.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.errors import StateError
from gpufleet.home import ensure_home
from gpufleet.state_file import check_openable, db_error
from gpufleet.store import postgres


def gpufleet_home() -> Path:
    """The state folder: $GPUFLEET_HOME or ~/.gpufleet; see `gpufleet.home` for which folder
    may be used and how a new one is made."""
    return ensure_home()


BUSY_TIMEOUT_S = 30.0


def _to_wal(cur: Any, timeout_s: float = BUSY_TIMEOUT_S) -> None:
    """Switch a new state file to WAL, retrying while another connection holds it.

    Changing the journal mode needs the file to itself, and SQLite answers "database is locked"
    at once there instead of waiting on busy_timeout: connections opening a new store at the
    same moment (a server's threads, two first commands) failed 1 time in 3 here, with four
    threads, until they retried. A file already in WAL keeps it, and the pragma returns at once.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy's BEGIN below control transactions instead of the sqlite3 module.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    _to_wal(cur)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    # Reads take no write lock (WAL lets them run beside a writer); writes take it up front, so
    # two writers queue on busy_timeout instead of failing when one upgrades a read lock.
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("readonly") else
                         "BEGIN IMMEDIATE")


# Bumped when a change cannot be made by adding columns. SQLite keeps it in PRAGMA user_version.
# 2: reservations keyed by (pool, node, device), rebuilt in place by _rekey_reservations.
SCHEMA_VERSION = 2


def _set_aside_prerelease(path: Path) -> None:
    """A state file from before schema versions (user_version 0 with tables in it) had a unique
    cluster name that no ALTER can drop; it is kept beside the new one, not migrated."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with sqlite3.connect(path) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
    db.close()
    if version == 0 and tables:
        aside = path.with_name(f"{path.name}.pre-{SCHEMA_VERSION}-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            src = path.with_name(path.name + suffix)
            if src.exists():
                src.rename(aside.with_name(aside.name + suffix))
        print(f"gpufleet: {path} is from a pre-release version; kept as {aside.name}, starting "
              "a new state file", file=sys.stderr)


def _migrate(engine: Engine) -> None:
    """Bring the store to the newest schema (`store.migrations`: Alembic, with the fix-ups of
    the versions before it) in one write transaction, so two processes opening a new store at
    once take turns (on PostgreSQL, DDL is transactional too)."""
    from gpufleet.store import migrations

    with engine.begin() as conn:
        migrations.migrate(conn)
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _owner_only(path: Path) -> None:
    """Create the state file 0600, or take group and other bits off an existing one; a
    read-only (or immutable) file stays so, and SQLite's error then says why in one line."""
    if not path.exists():
        path.touch(mode=0o600)
        path.chmod(0o600)
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        with suppress(OSError):
            path.chmod(mode & 0o700)


DB_ENV = "GPUFLEET_DB"  # set by `gpufleet server --db URL`; its supervisors inherit it


class Store:
    """A handle on the database. `session()` is one transaction, committed on normal exit.

    The default store is `$GPUFLEET_HOME/state.db`, refused (StateError) when it is damaged or
    was removed under a running job (`state_file.open_problem`). Its connections open the file
    with SQLite's `mode=rw`, so none of them ever creates an empty state file in place of one
    that went away; only a new store's file is created here. An sqlite3 error that means the
    file cannot be used becomes a StateError (one line) wherever a session meets it.

    A `postgresql://` URL is a database on a server instead (store/postgres.py): the same
    tables, writers serialized by an advisory lock, and a server that cannot be reached a
    StateError too."""

    def __init__(self, url: str | None = None):
        self.path: Path | None = None
        if url is None:  # a team server's database, for every process it starts
            url = os.environ.get(DB_ENV) or None
        if url is None:
            path = self.path = gpufleet_home() / "state.db"
            check_openable(path)
            with self._translated():
                _set_aside_prerelease(path)
            _owner_only(path)
            url = f"sqlite:///file:{quote(str(path))}?mode=rw&uri=true"
        self.url = url
        # this process's writers take turns here before SQLite's lock: a writer waiting on
        # SQLite's (busy_timeout) retries after sleeps of up to 100 ms, so the threads of one
        # server queued there wait many times longer than the transactions ahead of them take
        self._turn: AbstractContextManager[Any] = (
            threading.RLock() if url.startswith("sqlite") else nullcontext())
        if postgres.is_postgres(url):
            self.engine: Engine = postgres.create(url)
        else:
            self.engine = create_engine(url)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _sqlite_begin)
        with self._translated():
            _migrate(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._reads = sessionmaker(self.engine.execution_options(readonly=True),
                                   expire_on_commit=False)

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """sqlite3 errors about the state file, and a PostgreSQL server that cannot be reached,
        as one StateError line; others unchanged."""
        try:
            yield
        except StateError:
            raise
        except Exception as exc:
            if self.path is not None:
                state = db_error(self.path, exc)
            elif self.engine.dialect.name == "postgresql":
                state = postgres.unreachable(self.url, exc)
            else:
                state = None
            if state is None:
                raise
            raise state from None

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A write transaction (serialized with every other writer)."""
        with self._turn, self._translated(), self._sessions() as s, s.begin():
            yield s

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only transaction: a consistent snapshot that never waits for writers."""
        with self._translated(), self._reads() as s, s.begin():
            yield s

    def close(self) -> None:
        self.engine.dispose()
