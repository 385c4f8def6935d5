"""The store on both of its backends: every test here runs on a fresh SQLite file and on a fresh
PostgreSQL database, and the two must behave the same (tables, keys, serialized writers,
snapshot reads, the new tables' rows, the accounts and ledger functions on them).

The PostgreSQL server is the one `.ci/run` (or `scripts/check`) starts with
`scripts/test-postgres`, named by $GPUFLEET_TEST_POSTGRES; this module creates its own database
on it and drops it at the end. Without the variable the PostgreSQL half is skipped (a failure
under CI=true).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from gpufleet.errors import StateError
from gpufleet.lifecycle import accounts, job_runs, ledger
from gpufleet.store import (
    AuditEvent,
    Budget,
    Cluster,
    Job,
    LedgerRow,
    Metric,
    QueuedJob,
    Quota,
    Reservation,
    Store,
    Team,
    User,
    retention,
)
from gpufleet.store import postgres as pg
from gpufleet.store.models import Base

ENV = "GPUFLEET_TEST_POSTGRES"
ROOT = accounts.Identity("root", None, True)


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """A database of this module's own on the test server, dropped at the end."""
    base = os.environ.get(ENV)
    if not base:
        reason = f"${ENV} is not set (scripts/test-postgres up DIR prints it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    name = f"gpufleet_t{os.getpid()}_{secrets.token_hex(3)}"
    admin = create_engine(pg.engine_url(base), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty store: a new SQLite file, or the module's database emptied."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    db_url: str = request.getfixturevalue("pg_database")
    engine = create_engine(pg.engine_url(db_url))
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE")
        conn.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()
    return db_url


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    s = Store(url)
    yield s
    s.close()


def add_cluster(store: Store, name: str = "llama", disk_bytes: int = 10**9) -> int:
    with store.session() as s:
        c = Cluster(name=name, gpu="H100", count=2, nodes=1, network="pcie", disk_bytes=disk_bytes,
                    backend="local", price_book=None, usd_per_hour=2.5, status="running",
                    created_at=1_000.0, started_at=1_000.0, scratch_dir="/tmp/x", spec_json="{}")
        s.add(c)
        s.flush()
        return c.id


def add_job(store: Store, cluster_id: int, name: str = "train", **kw: Any) -> int:
    with store.session() as s:
        j = Job(name=name, cluster_id=cluster_id, status="running", spec_json="{}", job_dir="/x",
                world_size=2, created_at=1_000.0, **kw)
        s.add(j)
        s.flush()
        return j.id


def reservation(cluster_id: int, device: str = "gpu0", pool: str = "local") -> Reservation:
    return Reservation(cluster_id=cluster_id, pool=pool, node_id="node-a", address="10.0.0.1",
                       device_id=device, device_index=0)


def in_thread(fn: Callable[[], Any], timeout_s: float = 60.0) -> tuple[bool, Any]:
    """Run `fn` in a thread; (whether it finished within `timeout_s`, its result or error)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    return (not t.is_alive(), out[0] if out else None)


# -- tables and migration -------------------------------------------------------------------


def test_every_table_is_created_and_opening_again_changes_nothing(url: str) -> None:
    first = Store(url)
    cid = add_cluster(first)
    first.close()
    again = Store(url)  # the migration runs again on a complete schema
    tables = set(inspect(again.engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    with again.read() as s:
        assert s.scalar(select(Cluster.name).where(Cluster.id == cid)) == "llama"
    again.close()


def test_stores_opened_at_once_on_an_empty_database_all_open(url: str) -> None:
    # each migration is a write transaction: the later ones wait, then find the tables made
    start = threading.Barrier(3)

    def open_one() -> str:
        start.wait(60)
        Store(url).close()
        return "opened"

    with ThreadPoolExecutor(3) as pool:
        opened = [f.result(timeout=120) for f in [pool.submit(open_one) for _ in range(3)]]
    assert opened == ["opened"] * 3


def test_a_column_missing_from_an_older_store_is_added(url: str) -> None:
    Store(url).close()
    engine = create_engine(pg.engine_url(url))
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE jobs DROP COLUMN first_step")
        conn.exec_driver_sql("DROP TABLE alembic_version")  # a version before Alembic
    engine.dispose()
    store = Store(url)
    assert "first_step" in {c["name"] for c in inspect(store.engine).get_columns("jobs")}
    cid = add_cluster(store)
    add_job(store, cid, first_step=7)
    with store.read() as s:
        assert s.scalar(select(Job.first_step)) == 7
    store.close()


# -- keys ----------------------------------------------------------------------------------


def test_a_device_has_one_holder_per_pool(store: Store) -> None:
    a, b = add_cluster(store, "a"), add_cluster(store, "b")
    with store.session() as s:
        s.add(reservation(a))
    with pytest.raises(IntegrityError), store.session() as s:
        s.add(reservation(b))
    with store.session() as s:  # the same node and device names in another pool are others
        s.add(reservation(b, pool="ray"))
    with store.read() as s:
        held = [(r.cluster_id, r.pool) for r in s.scalars(select(Reservation).order_by(Reservation.id))]
    assert held == [(a, "local"), (b, "ray")]


def test_a_reservation_needs_its_cluster(store: Store) -> None:
    with pytest.raises(IntegrityError), store.session() as s:
        s.add(reservation(999))


# -- serialized writers, snapshot readers --------------------------------------------------


def _claim(store: Store, cluster_id: int, after_read: Callable[[], None]) -> str:
    """An allocation in miniature: is gpu0 free? then take it, in one write transaction."""
    with store.session() as s:
        held = s.scalar(select(Reservation.id).where(Reservation.pool == "local",
                                                     Reservation.node_id == "node-a",
                                                     Reservation.device_id == "gpu0"))
        after_read()
        if held is not None:
            return "taken"
        s.add(reservation(cluster_id))
    return "claimed"


@pytest.mark.parametrize("stores", ["one store", "a store each"])
def test_two_writers_never_both_see_a_device_free(url: str, stores: str) -> None:
    """The first writer reads, then lingers while the second starts: the second must wait for
    it and then see the device taken. (Without the serialization the second would read it
    free too, and then fail on the unique key, or on SQLite on a stale snapshot.)"""
    _two_writers(url, one_store=stores == "one store")


def test_writers_serialize_whatever_the_servers_default_isolation(pg_database: str) -> None:
    engine = create_engine(pg.engine_url(pg_database), isolation_level="AUTOCOMMIT")
    name = make_url(pg_database).database
    with engine.connect() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET default_transaction_isolation = '
                             "'repeatable read'")
    try:
        _two_writers(pg_database, one_store=False)
    finally:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" RESET default_transaction_isolation')
        engine.dispose()


def _two_writers(url: str, one_store: bool) -> None:
    first = Store(url)
    second = first if one_store else Store(url)
    a, b = add_cluster(first, "a"), add_cluster(first, "b")
    first_read, second_starting = threading.Event(), threading.Event()

    def linger() -> None:
        first_read.set()
        assert second_starting.wait(60)
        time.sleep(0.5)  # time for the second to reach its read, were it not made to wait

    def second_writer() -> str:
        assert first_read.wait(60)
        second_starting.set()
        return _claim(second, b, lambda: None)

    with ThreadPoolExecutor(1) as pool:
        later = pool.submit(second_writer)
        mine = _claim(first, a, linger)
        theirs = later.result(timeout=120)
    assert (mine, theirs) == ("claimed", "taken")
    with first.read() as s:
        assert [r.cluster_id for r in s.scalars(select(Reservation))] == [a]
    first.close()
    second.close()


def test_reads_do_not_wait_for_a_writer_and_see_only_what_was_committed(store: Store) -> None:
    cid = add_cluster(store)

    def count() -> int:
        with store.read() as s:
            return len(s.scalars(select(Reservation)).all())

    with store.session() as w:
        w.add(reservation(cid))
        w.flush()  # the row is written, and the write lock held, until the block ends
        finished, seen = in_thread(count)
        assert finished, "a read waited for the writer"
        assert seen == 0
    assert count() == 1


def test_a_read_is_one_snapshot(store: Store) -> None:
    cid = add_cluster(store)
    with store.read() as r:
        before = len(r.scalars(select(Reservation)).all())

        def write() -> None:
            with store.session() as w:
                w.add(reservation(cid))

        assert in_thread(write) == (True, None)
        assert len(r.scalars(select(Reservation)).all()) == before == 0
    with store.read() as r:
        assert len(r.scalars(select(Reservation)).all()) == 1


# -- column types --------------------------------------------------------------------------


def test_the_new_tables_round_trip(store: Store) -> None:
    cid = add_cluster(store, disk_bytes=10**12)  # 1 TB: past a 32-bit INTEGER
    jid = add_job(store, cid, samples=3 * 2**31, user="ada", team="ml")
    big = 5 * 2**31 + 7
    t = 1_767_225_600.123456  # a 2026 time, to the microsecond
    long_name = "a_metric_name_longer_than_its_column_is_declared_" * 3  # 150 characters
    with store.session() as s:
        s.add(Team(name="ml", created_at=t))
        s.add(User(name="ada", team="ml", admin=True, token_sha256="ab" * 32, created_at=t))
        s.add(Quota(team="ml", gpu="H100", devices=16))
        s.add(Budget(team="ml", month="2026-01", usd=1234.5))
        s.add(QueuedJob(name="next", user="ada", team="ml", priority=-3, submitted_at=t,
                        spec_json='{"a": 1}', pool="local", gpu="H100", count=8,
                        usd_per_hour=19.92, time_limit_s=3600.0, status="queued"))
        s.add(AuditEvent(time=t, user="ada", action="submit", subject="next", detail="é ✓"))
        s.add(LedgerRow(job_id=jid, job="train", user="ada", team="ml", gpu="H100", devices=8,
                        price_book=None, usd_per_hour=19.92, start=t, end=t + 60,
                        micro_usd=big, open=False))
        # lengths in the schema are not limits on either backend (store/models.py)
        s.add(Metric(id=2**33, time=t, cluster="c", job="train", node="local", rank=0,
                     name=long_name, value=0.5))
    with store.read() as s:
        c = s.get(Cluster, cid)
        j = s.get(Job, jid)
        u = s.scalar(select(User))
        q = s.scalar(select(QueuedJob))
        a = s.scalar(select(AuditEvent))
        row = s.scalar(select(LedgerRow))
        m = s.scalar(select(Metric))
        quota, budget = s.scalar(select(Quota)), s.scalar(select(Budget))
        assert c is not None and j is not None and u is not None and q is not None
        assert a is not None and row is not None and m is not None
        assert quota is not None and budget is not None
        assert (c.disk_bytes, j.samples, j.user) == (10**12, 3 * 2**31, "ada")
        assert (u.name, u.team, u.admin, u.created_at) == ("ada", "ml", True, t)
        assert (quota.team, quota.gpu, quota.devices) == ("ml", "H100", 16)
        assert (budget.month, budget.usd) == ("2026-01", 1234.5)
        assert (q.priority, q.count, q.usd_per_hour, q.time_limit_s, q.status, q.cluster) == (
            -3, 8, 19.92, 3600.0, "queued", None)
        assert (a.detail, a.time) == ("é ✓", t)
        assert (row.micro_usd, row.open, row.end) == (big, False, t + 60)
        assert (m.id, m.name) == (2**33, long_name)
    assert ledger.spent_since(store, t) == {"ml": big / ledger.MICRO}


def test_ledger_sums_are_whole_micro_dollars_past_32_bits(store: Store) -> None:
    cid = add_cluster(store)
    jid = add_job(store, cid, user="ada", team="ml")
    parts = [2**31 + 1, 2**32 + 3, 7]
    with store.session() as s:
        for i, amount in enumerate(parts):
            s.add(LedgerRow(job_id=jid, job="train", user="ada", team="ml", gpu="H100", devices=2,
                            price_book=None, usd_per_hour=2.5, start=1_000.0 + i, end=1_001.0 + i,
                            micro_usd=amount, open=False))
    assert ledger.spent_since(store, 0.0) == {"ml": sum(parts) / ledger.MICRO}
    summed = ledger.usage(ledger.rows(store, team="ml"), "team")
    assert summed["micro_usd"] == sum(parts) and summed["groups"][0]["jobs"] == 1


# -- the accounts and ledger functions on either backend -------------------------------------


def test_accounts_on_the_store(store: Store) -> None:
    now = time.time()
    month = accounts.current_month(now)
    token = accounts.add_user(store, ROOT, "ada", "ml", admin=False)
    accounts.add_user(store, ROOT, "bob", None, admin=True)
    assert accounts.from_token(store, token) == accounts.Identity("ada", "ml", False)
    accounts.set_quota(store, ROOT, "ml", "H100", 8)
    accounts.set_quota(store, ROOT, "ml", "H100", 4)  # replaced, not a second row
    accounts.set_budget(store, ROOT, "ml", 100.0, None, now)
    accounts.set_budget(store, ROOT, "ml", 250.0, month, now)
    with store.read() as s:
        assert accounts.budgets_for(s, month) == {"ml": 250.0}
        assert accounts.budgets_for(s, "2099-01") == {"ml": 100.0}
        assert accounts.quotas(s) == {("ml", "H100-SXM"): 4}  # the catalog's name
    log = accounts.audit_log(store)
    assert [e["action"] for e in log] == ["budget_set", "budget_set", "quota_set", "quota_set",
                                          "user_add", "user_add"]
    assert [e["subject"] for e in accounts.audit_log(store, user="root", limit=2)] == ["ml", "ml"]
    assert [u["name"] for u in accounts.users(store)] == ["ada", "bob"]


def test_ledger_on_the_store(store: Store) -> None:
    now = 1_767_225_600.0 + 15 * 86400  # mid January 2026, UTC
    since = ledger.month_start(now)
    assert since == 1_767_225_600.0
    assert ledger.accrue(store, now) == 0  # no jobs: nothing booked
    assert ledger.spent_since(store, since) == {}
    assert ledger.usage(ledger.rows(store, since=since), "user")["micro_usd"] == 0


def test_ledger_books_a_running_job(store: Store) -> None:
    cid = add_cluster(store)  # 2.5 USD an hour since t=1000
    jid = add_job(store, cid, user="ada", team="ml")
    with store.session() as s:  # its run, as `jobs.create` opens it
        j, c = s.get(Job, jid), s.get(Cluster, cid)
        assert j is not None and c is not None
        job_runs.open_run(s, j, c, 1_000.0, fresh=False)
    assert ledger.accrue(store, 1_000.0 + 3600) == 1
    assert ledger.accrue(store, 1_000.0 + 7200) == 1  # the open row grows
    with store.read() as s:
        booked = [(r.job_id, r.micro_usd, r.open) for r in s.scalars(select(LedgerRow))]
    assert booked == [(jid, 5_000_000, True)]
    assert ledger.spent_since(store, 0.0) == {"ml": 5.0}


def test_old_samples_are_merged_into_their_buckets(store: Store) -> None:
    with store.session() as s:
        s.add_all(Metric(time=float(t), cluster="c", job="train", node="local", rank=0, name="x",
                         value=t / 1000.0) for t in range(1_000, 3_000))
    retention.compact(store, "train", 3_000.0)
    with store.read() as s:
        found = s.execute(select(Metric.time, Metric.value, Metric.resolution)
                          .order_by(Metric.time)).all()
    merged = [(t, v) for t, v, res in found if res == 10.0]
    raw = [t for t, _, res in found if res is None]
    # ten-second buckets from 1000 s up to the cut at 2400 s, each the mean of its ten samples
    assert [t for t, _ in merged] == [b + 4.5 for b in range(1_000, 2_400, 10)]
    assert all(v == pytest.approx(t / 1000.0) for t, v in merged)
    assert raw == [float(t) for t in range(2_400, 3_000)]


# -- a server that cannot be reached -------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    port = _closed_port()
    with pytest.raises(StateError) as err:
        Store(f"postgresql://ada:hunter2@127.0.0.1:{port}/fleet")
    message = str(err.value)
    assert "\n" not in message and "hunter2" not in message
    assert f"postgresql://ada@127.0.0.1:{port}/fleet" in message
    assert "Connection refused" in message


def test_a_connection_lost_in_a_session_is_one_line_and_the_next_session_reconnects(
        pg_database: str) -> None:
    store = Store(pg_database)
    admin = create_engine(pg.engine_url(pg_database), isolation_level="AUTOCOMMIT")
    with pytest.raises(StateError, match="cannot use the PostgreSQL store"), store.session() as s:
        pid = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        s.execute(text("SELECT 1"))
    with store.session() as s:
        assert s.execute(text("SELECT 1")).scalar_one() == 1
    admin.dispose()
    store.close()
