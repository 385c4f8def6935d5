"""The billing ledger on a real SQLite store: a job's rows always add up to the cost every
screen shows (`supervise.view.job_cost_usd`, to the micro-dollar), a new row opens when the rate,
the book or the month changes, and usage groups add up to the total exactly."""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.lifecycle import clusters, ledger
from gpufleet.lifecycle.status import JobStatus
from gpufleet.store import Cluster, Job, LedgerRow, Store
from gpufleet.supervise.view import job_cost_usd

FEB = float(calendar.timegm((2030, 2, 1, 0, 0, 0)))  # a UTC month start
T0 = FEB - 10 * 3600.0  # ten hours before it


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def add_job(store: Store, name: str, rate: float = 2.345, start: float = T0, count: int = 2,
            user: str | None = "ana", team: str | None = "vision", gpu: str = "A100",
            book: str | None = "marketplace", ended: float | None = None,
            simulated: bool = False) -> int:
    with store.session() as s:
        c = Cluster(name=f"c-{name}", gpu=gpu, count=count, nodes=1, network="pcie",
                    disk_bytes=1, backend="local", price_book=book, usd_per_hour=rate,
                    status="running" if ended is None else "stopped", created_at=start,
                    started_at=start, stopped_at=ended, scratch_dir="/nonexistent",
                    spec_json="{}", for_job=name, simulated=simulated)
        s.add(c)
        s.flush()
        j = Job(name=name, cluster_id=c.id, status=JobStatus.RUNNING if ended is None
                else JobStatus.SUCCEEDED, spec_json="{}", job_dir="/nonexistent", world_size=count,
                created_at=start, started_at=start, ended_at=ended, samples=0, user=user,
                team=team)
        s.add(j)
        s.flush()
        return j.id


def job_rows(store: Store, job_id: int) -> list[LedgerRow]:
    with store.read() as s:
        return list(s.scalars(select(LedgerRow).where(LedgerRow.job_id == job_id)
                              .order_by(LedgerRow.id)))


def cost_now(store: Store, job_id: int, now: float) -> int:
    with store.read() as s:
        j = s.get(Job, job_id)
        assert j is not None
        c = s.get(Cluster, j.cluster_id)
        assert c is not None
        return ledger.micro(job_cost_usd(j, c, now))


def total(store: Store, job_id: int) -> int:
    return sum(r.micro_usd for r in job_rows(store, job_id))


def end_job(store: Store, job_id: int, at: float) -> None:
    with store.session() as s:
        j = s.get(Job, job_id)
        assert j is not None
        j.status, j.ended_at = JobStatus.SUCCEEDED, at


def test_a_running_job_grows_one_row_that_always_equals_its_cost(store: Store) -> None:
    jid = add_job(store, "a")
    last = 0
    for now in (T0 + 1.0, T0 + 7.3, T0 + 61.9, T0 + 3600.0, T0 + 3601.1):
        assert ledger.accrue(store, now) == 1
        rows = job_rows(store, jid)
        assert len(rows) == 1 and rows[0].open
        assert total(store, jid) == cost_now(store, jid, now) > last
        assert rows[0].end == now and rows[0].start == T0
        last = total(store, jid)


def test_an_ended_job_closes_its_rows_at_its_final_cost_and_stops_growing(store: Store) -> None:
    jid = add_job(store, "a")
    ledger.accrue(store, T0 + 100.0)
    end_job(store, jid, T0 + 250.5)
    assert ledger.accrue(store, T0 + 300.0) == 1
    final = cost_now(store, jid, T0 + 9999.0)  # frozen at its end
    assert total(store, jid) == final == ledger.micro(2.345 * 250.5 / 3600)
    assert not any(r.open for r in job_rows(store, jid))
    assert job_rows(store, jid)[-1].end == T0 + 250.5
    assert ledger.accrue(store, T0 + 5000.0) == 0  # not looked at again
    assert total(store, jid) == final


def test_a_rate_change_opens_a_row_and_the_sum_stays_exact(store: Store) -> None:
    jid = add_job(store, "a", rate=4.0, count=4)
    ledger.accrue(store, T0 + 600.0)
    with store.session() as s:  # the cluster shrinks to 3 devices, as clusters.heal does
        c = s.scalar(select(Cluster).where(Cluster.name == "c-a"))
        assert c is not None
        clusters._rebill(c, 3, T0 + 900.0)
        c.count = 3
        c.usd_per_hour = 3.0
    ledger.accrue(store, T0 + 1200.0)
    rows = job_rows(store, jid)
    assert [(r.usd_per_hour, r.devices, r.open) for r in rows] == [(4.0, 4, False),
                                                                   (3.0, 3, True)]
    assert rows[1].start == rows[0].end == T0 + 600.0
    assert total(store, jid) == cost_now(store, jid, T0 + 1200.0)
    assert total(store, jid) == ledger.micro(4.0 * 900 / 3600 + 3.0 * 300 / 3600)
    ledger.accrue(store, T0 + 1500.0)
    assert len(job_rows(store, jid)) == 2  # the new rate's row grows
    assert total(store, jid) == cost_now(store, jid, T0 + 1500.0)


def test_a_month_start_opens_a_row_and_the_month_counts_only_its_own(store: Store) -> None:
    jid = add_job(store, "a", rate=3.6)  # $0.001 a second
    ledger.accrue(store, FEB - 3600.0)
    ledger.accrue(store, FEB + 1800.0)
    rows = job_rows(store, jid)
    assert total(store, jid) == cost_now(store, jid, FEB + 1800.0)
    assert [(r.start, r.end, r.open) for r in rows] == [(T0, FEB, False), (FEB, FEB + 1800.0, True)]
    assert rows[0].micro_usd == ledger.micro(0.001 * 10 * 3600)  # January's ten hours
    assert ledger.spent_since(store, FEB) == {"vision": pytest.approx(1.8)}  # February's 1800 s
    ledger.accrue(store, FEB + 3600.0)
    assert len(job_rows(store, jid)) == 2  # February's row grows
    assert ledger.spent_since(store, FEB) == {"vision": pytest.approx(3.6)}
    assert ledger.spent_since(store, ledger.month_start(T0))["vision"] == pytest.approx(39.6)


def test_a_job_booked_first_after_months_is_split_by_month(store: Store) -> None:
    mar = float(calendar.timegm((2030, 3, 1, 0, 0, 0)))
    jid = add_job(store, "old", rate=1.0, ended=mar + 7200.0)
    ledger.accrue(store, mar + 9000.0)
    rows = job_rows(store, jid)
    assert [ledger.month_start(r.start) for r in rows] == [ledger.month_start(T0), FEB, mar]
    assert total(store, jid) == cost_now(store, jid, mar + 9000.0)
    assert ledger.spent_since(store, mar) == {"vision": pytest.approx(2.0)}


def test_a_job_from_before_the_ledger_gets_its_rows_on_the_first_accrue(store: Store) -> None:
    jid = add_job(store, "old", ended=T0 + 3600.0)
    assert job_rows(store, jid) == []
    assert ledger.accrue(store, T0 + 7200.0) == 1
    rows = job_rows(store, jid)
    assert len(rows) == 1 and not rows[0].open
    assert (rows[0].start, rows[0].end) == (T0, T0 + 3600.0)
    assert total(store, jid) == ledger.micro(2.345) == cost_now(store, jid, T0 + 7200.0)
    assert ledger.accrue(store, T0 + 9000.0) == 0


def test_a_simulated_cluster_books_zero(store: Store) -> None:
    jid = add_job(store, "sim", rate=0.0, book=None, simulated=True)
    ledger.accrue(store, T0 + 3600.0)
    ledger.accrue(store, T0 + 7200.0)
    rows = job_rows(store, jid)
    assert len(rows) == 1 and rows[0].micro_usd == 0 and rows[0].price_book is None
    end_job(store, jid, T0 + 7300.0)
    ledger.accrue(store, T0 + 7400.0)
    assert [r.micro_usd for r in job_rows(store, jid)] == [0]
    assert ledger.accrue(store, T0 + 8000.0) == 0  # its zero row counts as booked


def test_a_cluster_that_never_started_books_nothing(store: Store) -> None:
    jid = add_job(store, "pending")
    with store.session() as s:
        c = s.scalar(select(Cluster).where(Cluster.name == "c-pending"))
        assert c is not None
        c.started_at = None
    assert ledger.accrue(store, T0 + 60.0) == 0
    assert job_rows(store, jid) == []


def test_a_resumed_job_keeps_its_first_run_and_books_no_refund(store: Store) -> None:
    jid = add_job(store, "r", rate=3.6, ended=T0 + 1000.0)
    ledger.accrue(store, T0 + 1000.0)
    first = total(store, jid)
    assert first == ledger.micro(1.0)
    with store.session() as s:  # `run --resume`: a new cluster made for it, the same record
        c = Cluster(name="c-r2", gpu="A100", count=2, nodes=1, network="pcie", disk_bytes=1,
                    backend="local", price_book="marketplace", usd_per_hour=7.2,
                    status="running", created_at=T0 + 5000.0, started_at=T0 + 5000.0,
                    scratch_dir="/nonexistent", spec_json="{}", for_job="r")
        s.add(c)
        s.flush()
        j = s.get(Job, jid)
        assert j is not None
        j.cluster_id, j.status, j.ended_at = c.id, JobStatus.STARTING, None
    ledger.accrue(store, T0 + 5100.0)
    rows = job_rows(store, jid)
    assert all(r.micro_usd >= 0 for r in rows)
    assert total(store, jid) == first + cost_now(store, jid, T0 + 5100.0)
    assert total(store, jid) == ledger.micro(1.0 + 0.2)


def test_usage_groups_add_up_to_the_total_exactly(store: Store) -> None:
    rates = (0.1234567, 2.345, 7.77, 0.3333333, 1.0)
    for i, rate in enumerate(rates):
        add_job(store, f"j{i}", rate=rate, count=1 + i % 3, user=("ana", "bo", "cy")[i % 3],
                team=(None, "vision", "nlp")[i % 3], gpu=("A100", "H100")[i % 2],
                start=T0 + 13.7 * i)
    ledger.accrue(store, T0 + 1234.5)
    ledger.accrue(store, FEB + 77.7)
    found = ledger.rows(store)
    every = sum(r.micro_usd for r in found)
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
    assert by_job == {f"j{i}": total(store, i + 1) for i in range(5)}


def test_spent_since_counts_teams_only_and_rows_filter(store: Store) -> None:
    add_job(store, "mine", rate=3.6, user="ana", team="vision")
    add_job(store, "solo", rate=3.6, user="bo", team=None)
    ledger.accrue(store, T0 + 1000.0)
    assert ledger.spent_since(store, T0) == {"vision": pytest.approx(1.0)}
    assert [r.job for r in ledger.rows(store, user="bo")] == ["solo"]
    assert [r.job for r in ledger.rows(store, team="vision")] == ["mine"]
    assert ledger.rows(store, since=T0 + 2000.0) == []
    no_user = add_job(store, "anon", user=None, team=None)
    ledger.accrue(store, T0 + 1100.0)
    assert job_rows(store, no_user)[0].user  # billed to the OS user when none was recorded


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
