"""A state file written by the version before the queue (tests/unit/data/state-before-queue.sql,
dumped from a real `gpufleet run` of that version) opens with the queue, users and ledger tables
and columns added in place; its job is listed and gets its ledger rows, equal to its cost, and
its cluster's idle time rows of its own."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import inspect, select

from gpufleet.lifecycle import accounts, ledger, listing
from gpufleet.plan.billing import job_cost_usd
from gpufleet.plan.cost import accrued_usd
from gpufleet.store import Cluster, Job, Store

DUMP = Path(__file__).parent / "data" / "state-before-queue.sql"
NEW_TABLES = {"queue", "users", "teams", "budgets", "quotas", "audit", "ledger"}


def test_a_state_file_from_before_the_queue_gains_it_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path))
    tmp_path.chmod(0o700)
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as db:
        db.executescript(DUMP.read_text())
        db.execute("PRAGMA user_version = 2")
        before = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    db.close()
    path.chmod(0o600)
    assert not (NEW_TABLES & before) and "jobs" in before
    store = Store()
    tables = set(inspect(store.engine).get_table_names())
    assert tables >= NEW_TABLES
    assert {"user", "team"} <= {c["name"] for c in inspect(store.engine).get_columns("jobs")}
    with store.read() as s:
        job, cluster = s.execute(select(Job, Cluster).join(Cluster)).one()
    assert (job.name, job.status, job.user) == ("old-job", "succeeded", None)
    rows = listing.table(store, accounts.Identity("someone", None, True), job.ended_at or 0,
                         every=True)
    assert [(r["name"], r["status"]) for r in rows] == [("old-job", "succeeded")]
    assert ledger.accrue(store, (job.ended_at or 0) + 10) == 1
    booked = ledger.rows(store)
    cost = job_cost_usd(job, cluster, (job.ended_at or 0) + 10)
    assert cost > 0
    assert sum(r.micro_usd for r in booked if r.job == "old-job") == round(cost * 1_000_000)
    # the cluster's time before and after the job is its idle time: all of it is booked
    assert sum(r.micro_usd for r in booked) == round(
        accrued_usd(cluster.usd_per_hour, cluster.started_at, cluster.stopped_at, 0.0) * 1e6)
    assert all(not r.open and r.user == accounts.os_user() for r in booked)
    assert ledger.accrue(store, (job.ended_at or 0) + 20) == 0  # booked once, closed
    store.close()


def test_a_job_running_across_the_upgrade_keeps_its_cost_and_its_cluster_gets_idle_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Revision 0005 on a store with a cluster launched 100 s ago and a job running on it for
    60 s: the job's cost goes on from what it showed, and the cluster's first 40 s are idle."""
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path))
    tmp_path.chmod(0o700)
    path = tmp_path / "state.db"
    t = time.time()
    with sqlite3.connect(path) as db:
        db.executescript(DUMP.read_text())
        db.execute("PRAGMA user_version = 2")
        db.execute("INSERT INTO clusters (id, name, gpu, count, nodes, network, disk_bytes, "
                   "backend, price_book, usd_per_hour, status, created_at, started_at, "
                   "scratch_dir, spec_json) VALUES (2, 'dev', 'cpu', 1, 1, 'pcie', 1, 'local', "
                   "'hyperscaler', 3.6, 'running', ?, ?, '/x', '{}')", (t - 100, t - 100))
        db.execute("INSERT INTO jobs (id, name, cluster_id, status, spec_json, job_dir, "
                   "world_size, created_at, samples) VALUES (2, 'live', 2, 'running', '{}', '/x', "
                   "1, ?, 0)", (t - 60,))
    db.close()
    path.chmod(0o600)
    store = Store()
    now = time.time() + 5
    with store.read() as s:
        job = s.scalar(select(Job).where(Job.name == "live"))
        assert job is not None
        dev = s.get(Cluster, job.cluster_id)
        assert dev is not None and not dev.settled
    assert abs(round(job_cost_usd(job, dev, now) * 1e6) - round((now - (t - 60)) * 1000)) <= 1
    ledger.accrue(store, now)
    rows = [r for r in ledger.rows(store) if r.cluster == "dev"]
    assert sum(r.micro_usd for r in rows) == round(accrued_usd(3.6, t - 100, None, now) * 1e6)
    assert sum(r.micro_usd for r in rows if r.job == "live") == \
        round(job_cost_usd(job, dev, now) * 1e6)
    idle = [r for r in rows if r.job is None]
    assert [(r.start, r.end) for r in idle] == [(t - 100, t - 60)]
    store.close()
