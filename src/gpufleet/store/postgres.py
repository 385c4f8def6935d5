"""The store on a PostgreSQL server (a team server's `--db postgresql://...`).

What SQLite's `BEGIN IMMEDIATE` gives the store, PostgreSQL gets from one transaction-scoped
advisory lock that every write transaction takes first: allocation reads the reservations and
writes new ones in one transaction, and two servers (or a server and an admin command) must
take turns, not both see the same devices free. Advisory locks are per database, so two
gpufleet databases on one server never wait for each other. Reads take no lock; they run in a
REPEATABLE READ, READ ONLY transaction, the consistent snapshot a WAL reader gets in SQLite.

Driver: psycopg 3. A user writes `postgresql://USER:PASSWORD@HOST:PORT/DB`; SQLAlchemy is told
`postgresql+psycopg://`. Nothing here imports psycopg: SQLAlchemy does, for a PostgreSQL URL only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.ext.compiler import compiles

from gpufleet.errors import StateError, excerpt

# The advisory lock key of gpufleet's write transactions ("gpuf" in ASCII); any constant works
# as long as every writer uses the same one.
WRITE_LOCK_KEY = 0x67707566
CONNECT_TIMEOUT_S = 10  # libpq waits forever by default for a host that never answers
_USER_SCHEMES = ("postgresql://", "postgres://")  # no driver named
# SQLSTATEs of a server that went away or is not accepting connections (class 08: connection
# exceptions; 57P01-03: shut down, crashed, starting up). Driver-side failures have none.
_GONE = ("08", "57P01", "57P02", "57P03")


@compiles(String, "postgresql")
def _unbounded(type_: String, compiler: Any, **kw: Any) -> str:
    """String(n) as VARCHAR without a length, as SQLite treats it (see store/models.py): a
    long metric name or GPU description is stored, not refused."""
    return "VARCHAR"


def is_postgres(url: str) -> bool:
    """A PostgreSQL URL, with or without a driver named."""
    return url.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


def create(url: str) -> Engine:
    """The engine of a PostgreSQL store: psycopg 3, the lock and snapshots of `begin`, and a
    ping on checkout, so a server restarted since a pooled connection was made is not an error.
    A URL SQLAlchemy cannot read is a StateError."""
    try:
        engine = create_engine(engine_url(url), pool_pre_ping=True, connect_args=connect_args(url))
    except (sa_exc.ArgumentError, ValueError) as exc:  # ValueError: a port that is no number
        raise StateError(f"state: the database URL cannot be read ({excerpt(str(exc), 160)}); "
                         "write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE") from None
    event.listen(engine, "begin", begin)
    return engine


def engine_url(url: str) -> str:
    """`url` with the psycopg 3 driver named (a user's URL names none); others unchanged."""
    for scheme in _USER_SCHEMES:
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme):]
    return url


def connect_args(url: str) -> dict[str, Any]:
    """A connect timeout unless the URL sets its own."""
    return {} if "connect_timeout" in make_url(url).query else {"connect_timeout": CONNECT_TIMEOUT_S}


def shown(url: str) -> str:
    """The URL as a message may show it: without its password, in the form the user wrote."""
    u = make_url(engine_url(url))  # (URL.set cannot unset a password: None means unchanged)
    query = {k: v for k, v in u.query.items() if k != "password"}
    safe = URL.create("postgresql", u.username, None, u.host, u.port, u.database, query)
    return safe.render_as_string(hide_password=False)


def begin(conn: Any) -> None:
    """Every transaction's first statements: readers ask for a snapshot and promise not to
    write; writers queue on the lock (held to commit or rollback). A writer is READ COMMITTED
    whatever the server's default, so each statement after the lock sees what the writer before
    it committed (a REPEATABLE READ snapshot would be taken by the lock statement, before the
    wait)."""
    if conn.get_execution_options().get("readonly"):
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    else:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")


def unreachable(url: str, exc: BaseException) -> StateError | None:
    """`exc` as one line when it means the server cannot be reached or refused the connection
    (down, wrong host or port, no such database or role, bad password); None for an error
    about a query, which is a bug to show as one."""
    if not isinstance(exc, sa_exc.OperationalError):
        return None
    state = getattr(exc.orig, "sqlstate", None)
    if state is not None and not state.startswith(_GONE):
        return None
    lines = [line.strip() for line in str(exc.orig).splitlines() if line.strip()]
    why = (lines[0] if lines else type(exc.orig).__name__).removeprefix("connection failed: ")
    return StateError(f"state: cannot use the PostgreSQL store at {shown(url)}: "
                      f"{excerpt(' '.join(why.split()), 240)}; check that the server is running "
                      "and the URL's host, port, database and user")
