"""The billing ledger on a real SQLite store, with runs opened and closed by the functions the
job and cluster lifecycles call (`lifecycle.job_runs`): a job's rows always add up to the cost
every screen shows (`plan.billing.job_cost_usd`), a cluster's rows to its cost (`list`), to
the micro-dollar; idle time is the owner's; a new row opens when the rate, the book or the month
changes; usage groups add up to the total exactly."""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.lifecycle import clusters, job_runs, ledger
from gpufleet.plan.billing import job_cost_usd
from gpufleet.plan.cost import accrued_usd
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Job, LedgerRow, Store, User

FEB = float(calendar.timegm((2030, 2, 1, 0, 0, 0)))  # a UTC month start
T0 = FEB - 10 * 3600.0  # ten hours before it


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def add_cluster(store: Store, name: str, rate: float = 2.345, start: float = T0,
                count: int = 2, gpu: str = "A100", book: str | None = "marketplace",
                for_job: str | None = None, user: str | None = None,
                simulated: bool = False) -> int:
    with store.session() as s:
        c = Cluster(name=name, gpu=gpu, count=count, nodes=1, network="pcie", disk_bytes=1,
                    backend="local", price_book=book, usd_per_hour=rate, status="running",
                    created_at=start, started_at=start, scratch_dir="/nonexistent",
                    spec_json="{}", for_job=for_job, simulated=simulated, user=user)
        s.add(c)
        s.flush()
        return c.id


def start_job(store: Store, name: str, cluster_id: int, at: float, user: str | None = "ana",
              team: str | None = "vision") -> int:
    """A job created (or resumed) on the cluster at `at`, its run opened as `jobs.create` does."""
    with store.session() as s:
        c = s.get(Cluster, cluster_id)
        assert c is not None
        j = s.scalar(select(Job).where(Job.name == name))
        # made for this run: the job's first, or a resume on a cluster made for it
        fresh = c.for_job == name and (j is None or j.cluster_id != cluster_id)
        if j is None:
            j = Job(name=name, cluster_id=cluster_id, status=JobStatus.RUNNING, spec_json="{}",
                    job_dir="/nonexistent", world_size=c.count, created_at=at, started_at=at,
                    samples=0, user=user, team=team, billed_micro_usd=0)
            s.add(j)
            s.flush()
        j.cluster_id, j.status, j.ended_at = cluster_id, JobStatus.RUNNING, None
        job_runs.open_run(s, j, c, at, fresh)
        return j.id


def own(store: Store, name: str, rate: float = 2.345, start: float = T0, **kw: Any) -> int:
    """`run`: a cluster made for the job, and the job on it (its run from the cluster's start)."""
    cid = add_cluster(store, f"c-{name}", rate, start, for_job=name, **kw)
    return start_job(store, name, cid, start + 1.5)


def end_job(store: Store, job_id: int, at: float) -> None:
    with store.session() as s:
        j = s.get(Job, job_id)
        assert j is not None
        j.status, j.ended_at = JobStatus.SUCCEEDED, at
        job_runs.job_ended(s, j, at)


def stop(store: Store, name: str, at: float) -> None:
    with store.session() as s:
        c = s.scalar(select(Cluster).where(Cluster.name == name, Cluster.status == "running"))
        assert c is not None
        c.status, c.stopped_at = "stopped", at
        job_runs.cluster_stopped(s, c)


def rows_of(store: Store, job_id: int | None = None, cluster: str | None = None
            ) -> list[LedgerRow]:
    with store.read() as s:
        q = select(LedgerRow).order_by(LedgerRow.id)
        if job_id is not None:
            q = q.where(LedgerRow.job_id == job_id)
        if cluster is not None:
            q = q.where(LedgerRow.cluster == cluster)
        return list(s.scalars(q))


def total(found: list[LedgerRow]) -> int:
    return sum(r.micro_usd for r in found)


def job_cost(store: Store, job_id: int, now: float) -> int:
    with store.read() as s:
        j = s.get(Job, job_id)
        assert j is not None
        c = s.get(Cluster, j.cluster_id)
        assert c is not None
        return ledger.micro(job_cost_usd(j, c, now))


def cluster_cost(store: Store, name: str, now: float) -> int:
    """What `list` shows, in micro-dollars (every cluster of that name)."""
    with store.read() as s:
        return sum(ledger.micro(accrued_usd(c.usd_per_hour, c.started_at, c.stopped_at, now,
                                            c.banked_usd or 0.0, c.rate_since))
                   for c in s.scalars(select(Cluster).where(Cluster.name == name)))


def test_a_running_job_grows_one_row_that_always_equals_its_cost(store: Store) -> None:
    jid = own(store, "a")
    last = 0
    for now in (T0 + 1.0, T0 + 7.3, T0 + 61.9, T0 + 3600.0, T0 + 3601.1):
        assert ledger.accrue(store, now) == 1
        rows = rows_of(store, jid)
        assert len(rows) == 1 and rows[0].open
        assert total(rows) == job_cost(store, jid, now) == cluster_cost(store, "c-a", now) > last
        assert rows[0].end == now and rows[0].start == T0  # from its cluster's first second
        last = total(rows)
    assert [r.id for r in rows_of(store, cluster="c-a")] == [r.id for r in rows_of(store, jid)]


def test_a_job_on_its_own_cluster_is_billed_to_the_stop_then_settled(store: Store) -> None:
    jid = own(store, "a")
    ledger.accrue(store, T0 + 100.0)
    end_job(store, jid, T0 + 250.5)
    ledger.accrue(store, T0 + 250.6)  # between the job's end and its cluster's stop
    stop(store, "c-a", T0 + 250.7)
    assert ledger.accrue(store, T0 + 300.0) == 1
    final = job_cost(store, jid, T0 + 9999.0)  # frozen at the stop
    assert total(rows_of(store, jid)) == final == cluster_cost(store, "c-a", T0 + 9999.0) \
        == ledger.micro(2.345 * 250.7 / 3600)
    assert not any(r.open for r in rows_of(store))
    assert rows_of(store, jid)[-1].end == T0 + 250.7
    assert ledger.accrue(store, T0 + 5000.0) == 0  # settled: not looked at again
    assert total(rows_of(store, jid)) == final


def test_a_rate_change_opens_a_row_and_the_sum_stays_exact(store: Store) -> None:
    jid = own(store, "a", rate=4.0, count=4)
    ledger.accrue(store, T0 + 600.0)
    with store.session() as s:  # the cluster shrinks to 3 devices, as spares.heal does
        c = s.scalar(select(Cluster).where(Cluster.name == "c-a"))
        assert c is not None
        clusters.rebill(c, 3, T0 + 900.0)
        c.count = 3
        c.usd_per_hour = 3.0
    ledger.accrue(store, T0 + 1200.0)
    rows = rows_of(store, jid)
    assert [(r.usd_per_hour, r.devices, r.open) for r in rows] == [(4.0, 4, False),
                                                                   (3.0, 3, True)]
    assert rows[1].start == rows[0].end == T0 + 600.0
    assert total(rows) == job_cost(store, jid, T0 + 1200.0)
    assert total(rows) == ledger.micro(4.0 * 900 / 3600 + 3.0 * 300 / 3600)
    ledger.accrue(store, T0 + 1500.0)
    assert len(rows_of(store, jid)) == 2  # the new rate's row grows
    assert total(rows_of(store, jid)) == job_cost(store, jid, T0 + 1500.0)


def test_a_month_start_opens_a_row_and_the_month_counts_only_its_own(store: Store) -> None:
    jid = own(store, "a", rate=3.6)  # $0.001 a second
    ledger.accrue(store, FEB - 3600.0)
    ledger.accrue(store, FEB + 1800.0)
    rows = rows_of(store, jid)
    assert total(rows) == job_cost(store, jid, FEB + 1800.0)
    assert [(r.start, r.end, r.open) for r in rows] == [(T0, FEB, False), (FEB, FEB + 1800.0, True)]
    assert rows[0].micro_usd == ledger.micro(0.001 * 10 * 3600)  # January's ten hours
    assert ledger.spent_since(store, FEB) == {"vision": pytest.approx(1.8)}  # February's 1800 s
    ledger.accrue(store, FEB + 3600.0)
    assert len(rows_of(store, jid)) == 2  # February's row grows
    assert ledger.spent_since(store, FEB) == {"vision": pytest.approx(3.6)}
    assert ledger.spent_since(store, ledger.month_start(T0))["vision"] == pytest.approx(39.6)


def test_a_cluster_first_booked_months_after_it_stopped_is_split_by_month(store: Store) -> None:
    """Nothing booked while it ran (no server, no `usage`): the first accrue books all of it."""
    mar = float(calendar.timegm((2030, 3, 1, 0, 0, 0)))
    jid = own(store, "old", rate=1.0)
    end_job(store, jid, mar + 7200.0)
    stop(store, "c-old", mar + 7200.0)
    assert ledger.accrue(store, mar + 9000.0) == 1
    rows = rows_of(store, jid)
    assert [ledger.month_start(r.start) for r in rows] == [ledger.month_start(T0), FEB, mar]
    assert total(rows) == job_cost(store, jid, mar + 9000.0) == \
        cluster_cost(store, "c-old", mar + 9000.0)
    assert ledger.spent_since(store, mar) == {"vision": pytest.approx(2.0)}
    assert not any(r.open for r in rows) and ledger.accrue(store, mar + 9900.0) == 0


def test_a_simulated_cluster_books_zero(store: Store) -> None:
    jid = own(store, "sim", rate=0.0, book=None, simulated=True)
    ledger.accrue(store, T0 + 3600.0)
    ledger.accrue(store, T0 + 7200.0)
    rows = rows_of(store, jid)
    assert len(rows) == 1 and rows[0].micro_usd == 0 and rows[0].price_book is None
    end_job(store, jid, T0 + 7300.0)
    stop(store, "c-sim", T0 + 7300.0)
    ledger.accrue(store, T0 + 7400.0)
    assert [r.micro_usd for r in rows_of(store)] == [0]
    assert ledger.accrue(store, T0 + 8000.0) == 0  # settled


def test_a_cluster_that_never_started_books_nothing(store: Store) -> None:
    cid = add_cluster(store, "pending")
    with store.session() as s:
        c = s.get(Cluster, cid)
        assert c is not None
        c.started_at = None
    assert ledger.accrue(store, T0 + 60.0) == 0
    assert rows_of(store) == []


def test_a_job_killed_and_resumed_on_a_new_cluster_costs_both(store: Store) -> None:
    """The first run's supervisor died unbooked; `reconcile` ended the job and stopped its
    cluster; `run --resume` made a new one. Its cost, its rows and its clusters agree."""
    jid = own(store, "r", rate=3.6)
    with store.session() as s:  # reconcile: the job ends; its own cluster's stop ends the run
        j = s.get(Job, jid)
        assert j is not None
        j.status, j.ended_at = JobStatus.INTERRUPTED, T0 + 1000.0
        job_runs.job_ended(s, j, T0 + 1000.0)
    stop(store, "c-r", T0 + 1000.2)
    first = job_cost(store, jid, T0 + 5000.0)
    assert first == ledger.micro(1000.2 / 1000)
    cid = add_cluster(store, "c-r", rate=7.2, start=T0 + 5000.0, for_job="r")  # the same name
    start_job(store, "r", cid, T0 + 5003.0)
    ledger.accrue(store, T0 + 5100.0)
    rows = rows_of(store, jid)
    assert all(r.micro_usd >= 0 for r in rows)
    assert total(rows) == job_cost(store, jid, T0 + 5100.0) == first + ledger.micro(0.2)
    assert total(rows_of(store)) == cluster_cost(store, "c-r", T0 + 5100.0) == total(rows)


def test_a_launched_cluster_bills_its_idle_time_to_its_owner_and_team(store: Store) -> None:
    with store.session() as s:
        s.add(User(name="bo", team="nlp", admin=False, token_sha256="b" * 64, created_at=T0))
    cid = add_cluster(store, "dev", rate=3.6, user="bo")
    jobs = []
    t = T0 + 60.0
    for i in range(4):  # four jobs of 30 s with 60 s between them
        jobs.append(start_job(store, f"j{i}", cid, t, user="bo", team="nlp"))
        end_job(store, jobs[-1], t + 30.0)
        t += 90.0
    ledger.accrue(store, T0 + 200.0)  # mid-way, as a server's beat
    with store.session() as s:
        for c in s.scalars(select(Cluster).where(Cluster.name == "dev")):
            c.status, c.stopped_at = "stopped", t - 30.0
    ledger.accrue(store, t + 100.0)
    idle = [r for r in rows_of(store, cluster="dev") if r.job_id is None]
    assert {(r.user, r.team, r.job) for r in idle} == {("bo", "nlp", None)}
    assert total(idle) + sum(total(rows_of(store, j)) for j in jobs) == \
        cluster_cost(store, "dev", t + 100.0)
    for j in jobs:
        assert total(rows_of(store, j)) == job_cost(store, j, t + 100.0) == ledger.micro(0.03)
    by_job = {g["job"]: g for g in ledger.usage(rows_of(store), "job")["groups"]}
    assert by_job["(idle) dev"]["micro_usd"] == total(idle) and by_job["(idle) dev"]["jobs"] == 0
    assert ledger.spent_since(store, T0) == {"nlp": pytest.approx(
        cluster_cost(store, "dev", t + 100.0) / 1e6)}  # idle time counts against the team


def test_usage_groups_add_up_to_the_total_exactly(store: Store) -> None:
    rates = (0.1234567, 2.345, 7.77, 0.3333333, 1.0)
    for i, rate in enumerate(rates):
        cid = add_cluster(store, f"c{i}", rate=rate, count=1 + i % 3, gpu=("A100", "H100")[i % 2],
                          start=T0 + 13.7 * i)
        start_job(store, f"j{i}", cid, T0 + 20.0 * i, user=("ana", "bo", "cy")[i % 3],
                  team=(None, "vision", "nlp")[i % 3])
    ledger.accrue(store, T0 + 1234.5)
    ledger.accrue(store, FEB + 77.7)
    found = ledger.rows(store)
    every = total(found)
    for by in ledger.GROUPS:
        got = ledger.usage(found, by)
        assert got["micro_usd"] == every
        assert sum(g["micro_usd"] for g in got["groups"]) == every
        assert all(isinstance(g["micro_usd"], int) for g in got["groups"])
        assert got["gpu_hours"] == pytest.approx(sum(g["gpu_hours"] for g in got["groups"]))
    teams = {g["team"]: g for g in ledger.usage(found, "team")["groups"]}
    assert set(teams) == {"-", "vision", "nlp"}  # jobs of no team are grouped too
    assert teams["-"]["jobs"] == 2 and teams["vision"]["jobs"] == 2
    by_job = {g["job"]: g["micro_usd"] for g in ledger.usage(found, "job")["groups"]}
    assert {k: v for k, v in by_job.items() if not k.startswith("(idle)")} == \
        {f"j{i}": total(rows_of(store, i + 1)) for i in range(5)}
    assert sorted(k for k in by_job if k.startswith("(idle)")) == \
        [f"(idle) c{i}" for i in range(1, 5)]  # c0's job started with it


def test_spent_since_counts_teams_only_and_rows_filter(store: Store) -> None:
    own(store, "mine", rate=3.6)
    cid = add_cluster(store, "c-solo", rate=3.6, for_job="solo")
    start_job(store, "solo", cid, T0 + 1.0, user="bo", team=None)
    ledger.accrue(store, T0 + 1000.0)
    assert ledger.spent_since(store, T0) == {"vision": pytest.approx(1.0)}
    assert [r.job for r in ledger.rows(store, user="bo")] == ["solo"]
    assert [r.job for r in ledger.rows(store, team="vision")] == ["mine"]
    assert ledger.rows(store, since=T0 + 2000.0) == []
    cid = add_cluster(store, "c-anon", for_job="anon", start=T0 + 1050.0)
    no_user = start_job(store, "anon", cid, T0 + 1051.0, user=None, team=None)
    ledger.accrue(store, T0 + 1100.0)
    assert rows_of(store, no_user)[0].user  # billed to the OS user when none was recorded


def test_by_month_cuts_at_month_starts_and_adds_up_exactly() -> None:
    may = float(calendar.timegm((2030, 5, 1, 0, 0, 0)))
    pieces = ledger.by_month(T0, may + 1.0, 1_000_003)
    assert [p[0] for p in pieces][1:] == [FEB, float(calendar.timegm((2030, 3, 1, 0, 0, 0))),
                                          float(calendar.timegm((2030, 4, 1, 0, 0, 0))), may]
    assert sum(p[2] for p in pieces) == 1_000_003
    assert all(a < b for a, b, _ in pieces) and pieces[-1][1] == may + 1.0
    assert ledger.by_month(T0, T0 + 5.0, -7) == [(T0, T0 + 5.0, -7)]
    assert ledger.by_month(T0 + 5.0, T0, -7) == [(T0 + 5.0, T0, -7)]  # a late-recorded end
    dec = float(calendar.timegm((2030, 12, 31, 12, 0, 0)))
    assert [p[2] for p in ledger.by_month(dec, dec + 86400.0, 100)] == [50, 50]  # into 2031


def test_a_window_counts_the_part_of_a_row_after_its_start() -> None:
    row = LedgerRow(job_id=1, job="j", user="u", team=None, gpu="cpu", devices=2,
                    price_book="b", usd_per_hour=3.6, start=1000.0, end=2000.0,
                    micro_usd=1_000_000, open=False)
    assert ledger.in_window(row, None) == (1_000_000, 1000.0)
    assert ledger.in_window(row, 500.0) == (1_000_000, 1000.0)  # all of it is inside
    assert ledger.in_window(row, 1750.0) == (250_000, 250.0)  # its last quarter
    assert ledger.in_window(row, 2500.0) == (0, 0.0)
    other = LedgerRow(job_id=2, job="k", user="v", team=None, gpu="cpu", devices=1,
                      price_book="b", usd_per_hour=1.0, start=1500.0, end=1800.0,
                      micro_usd=333_333, open=False)
    got = ledger.usage([row, other], "user", 1750.0)
    assert got["micro_usd"] == 250_000 + round(333_333 * 50 / 300)
    assert sum(g["micro_usd"] for g in got["groups"]) == got["micro_usd"]
    assert got["gpu_hours"] == pytest.approx((2 * 250.0 + 50.0) / 3600.0)
