"""The billing ledger: each job's cost as rows of (job, user, team, price book, rate, period,
micro-dollars), and usage summed from them.

A job's rows always add up to its cost as every screen shows it (`supervise.view.job_cost_usd`,
rounded to the micro-dollar): `accrue` computes that cost and books the difference since the
last time, in the open row while the rate, the book and the calendar month stay the same, in a
new row when any of them changes (an interval that spans a UTC month start is cut there). So a
month's spend is its rows, and no sum is ever off by the float rounding of many small additions.
"""

from __future__ import annotations

import calendar
import itertools
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, or_, select

from gpufleet.lifecycle import accounts
from gpufleet.lifecycle.status import JOB_ACTIVE
from gpufleet.store import Cluster, Job, LedgerRow, Store
from gpufleet.supervise.view import job_cost_usd

MICRO = 1_000_000
GROUPS = ("user", "team", "gpu", "job")


def month_start(t: float) -> float:
    g = time.gmtime(t)
    return float(calendar.timegm((g.tm_year, g.tm_mon, 1, 0, 0, 0)))


def micro(usd: float) -> int:
    return round(usd * MICRO)


def _next_month(t: float) -> float:
    g = time.gmtime(t)
    year, month = (g.tm_year + 1, 1) if g.tm_mon == 12 else (g.tm_year, g.tm_mon + 1)
    return float(calendar.timegm((year, month, 1, 0, 0, 0)))


def by_month(t0: float, t1: float, micro_usd: int) -> list[tuple[float, float, int]]:
    """`micro_usd` accrued evenly from `t0` to `t1`, as (start, end, amount) cut at each UTC
    month start between them, so each month's rows hold only that month's cost. The amounts
    add up to `micro_usd` exactly and are in proportion to time: exact for one rate, as between
    two accruals on a server; a job first booked long after it ended is spread by time."""
    if t1 <= t0:  # nothing new, or a correction (the job's end was recorded late)
        return [(t0, t1, micro_usd)]
    cuts = [t0]
    m = _next_month(t0)
    while m < t1:
        cuts.append(m)
        m = _next_month(m)
    cuts.append(t1)
    out = []
    before = 0
    for a, b in itertools.pairwise(cuts):
        upto = micro_usd if b == t1 else round(micro_usd * (b - t0) / (t1 - t0))
        out.append((a, b, upto - before))
        before = upto
    return out


def _job_window(j: Job, c: Cluster, now: float) -> tuple[float, float]:
    start = max(j.created_at, c.started_at or j.created_at)
    ends = [t for t in (j.ended_at, c.stopped_at) if t is not None]
    return start, max(start, min(ends) if ends else now)


def _continues(row: LedgerRow, c: Cluster, at: float) -> bool:
    """Whether cost from `at` on goes in `row`: the same rate, book and devices, in its month."""
    return (row.usd_per_hour == c.usd_per_hour and row.price_book == c.price_book
            and row.devices == c.count and month_start(row.start) == month_start(at))


def accrue(store: Store, now: float) -> int:
    """Bring every running job's rows (and those of jobs that ended since) up to `now`; the
    number of jobs booked. Jobs from before the ledger get their rows the first time.

    The rows of the job's current run (from its window's start on) add up to its cost; a job
    resumed on a new cluster keeps the rows of its earlier runs, which that cost no longer
    counts."""
    booked = 0
    with store.session() as s:
        open_jobs = select(LedgerRow.job_id).where(LedgerRow.open.is_(True))
        any_rows = select(LedgerRow.job_id)
        found = s.execute(
            select(Job, Cluster).join(Cluster, Cluster.id == Job.cluster_id)
            .where(or_(Job.status.in_(JOB_ACTIVE), Job.id.in_(open_jobs),
                       Job.id.not_in(any_rows)))).all()
        fallback = accounts.os_user()
        for j, c in found:
            if c.started_at is None:
                continue
            every = list(s.scalars(select(LedgerRow).where(LedgerRow.job_id == j.id)
                                   .order_by(LedgerRow.id)))
            start, end = _job_window(j, c, now)
            run = [r for r in every if r.start >= start]
            for r in every:
                if r.open and r not in run:
                    r.open = False  # an earlier run's row, on a cluster this job left
            delta = micro(job_cost_usd(j, c, now)) - sum(r.micro_usd for r in run)
            last = next((r for r in reversed(run) if r.open), None)
            has_rows = bool(every)
            for a, b, amount in by_month(run[-1].end if run else start, end, delta):
                if last is not None and _continues(last, c, a):
                    last.micro_usd += amount
                    last.end = max(last.start, b)
                    continue
                if last is not None:
                    last.open = False
                    last = None
                if amount != 0 or not has_rows:
                    last = LedgerRow(job_id=j.id, job=j.name, user=j.user or fallback,
                                     team=j.team, gpu=c.gpu, devices=c.count,
                                     price_book=c.price_book, usd_per_hour=c.usd_per_hour,
                                     start=a, end=max(a, b), micro_usd=amount, open=True)
                    s.add(last)
                    has_rows = True
            if j.status not in JOB_ACTIVE:
                s.flush()
                for r in s.scalars(select(LedgerRow).where(LedgerRow.job_id == j.id,
                                                           LedgerRow.open.is_(True))):
                    r.open = False
            booked += 1
    return booked


def spent_since(store: Store, since: float) -> dict[str, float]:
    """Each team's dollars in rows that accrued since `since` (a month's start: rows are cut
    there, so a row that ends at it is the month before's)."""
    with store.read() as s:
        found = s.execute(select(LedgerRow.team, func.sum(LedgerRow.micro_usd))
                          .where(LedgerRow.end > since, LedgerRow.team.is_not(None))
                          .group_by(LedgerRow.team)).all()
    return {team: int(total) / MICRO for team, total in found if team is not None}


def rows(store: Store, since: float | None = None, user: str | None = None,
         team: str | None = None) -> list[LedgerRow]:
    q = select(LedgerRow).order_by(LedgerRow.id)
    if since is not None:
        q = q.where(LedgerRow.end > since)
    if user is not None:
        q = q.where(LedgerRow.user == user)
    if team is not None:
        q = q.where(LedgerRow.team == team)
    with store.read() as s:
        return list(s.scalars(q))


def in_window(r: LedgerRow, since: float | None) -> tuple[int, float]:
    """The row's micro-dollars and seconds from `since` on: a row that began before it counts
    for its part after it (pro rata: one row is one rate), in whole micro-dollars."""
    span = max(0.0, r.end - r.start)
    if since is None or r.start >= since:
        return r.micro_usd, span
    inside = max(0.0, r.end - since)
    if span <= 0 or inside <= 0:
        return 0, 0.0
    return round(r.micro_usd * inside / span), inside


def usage(found: Iterable[LedgerRow], by: str, since: float | None = None) -> dict[str, Any]:
    """Rows summed per user, team, GPU type or job: dollars, GPU-hours, jobs; and the total,
    counting from `since` (None: whole rows). Sums are of whole micro-dollars, so the groups
    add up to the total exactly."""
    groups: dict[str, dict[str, Any]] = {}
    total = 0
    hours = 0.0
    for r in found:
        micro_usd, seconds = in_window(r, since)
        key = str(getattr(r, by) or "-")
        g = groups.setdefault(key, {by: key, "micro_usd": 0, "gpu_hours": 0.0, "jobs": set()})
        g["micro_usd"] += micro_usd
        h = r.devices * seconds / 3600.0
        g["gpu_hours"] += h
        g["jobs"].add(r.job)
        total += micro_usd
        hours += h
    out = []
    for g in sorted(groups.values(), key=lambda g: (-g["micro_usd"], g[by])):
        out.append({by: g[by], "usd": g["micro_usd"] / MICRO, "micro_usd": g["micro_usd"],
                    "gpu_hours": g["gpu_hours"], "jobs": len(g["jobs"])})
    return {"by": by, "groups": out, "usd": total / MICRO, "micro_usd": total,
            "gpu_hours": hours}
