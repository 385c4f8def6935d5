"""The billing ledger: each job's cost as rows of (job, user, team, price book, rate, period,
micro-dollars), and usage summed from them.

A job's rows always add up to its cost as every screen shows it (`supervise.view.job_cost_usd`,
rounded to the micro-dollar): `accrue` computes that cost and books the difference since the
last time, in the open row while the rate, the book and the calendar month stay the same, in a
new row when any of them changes. So a month's spend is its rows, and no sum is ever off by the
float rounding of many small additions.
"""

from __future__ import annotations

import calendar
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


def _job_window(j: Job, c: Cluster, now: float) -> tuple[float, float]:
    start = max(j.created_at, c.started_at or j.created_at)
    ends = [t for t in (j.ended_at, c.stopped_at) if t is not None]
    return start, max(start, min(ends) if ends else now)


def accrue(store: Store, now: float) -> int:
    """Bring every running job's rows (and those of jobs that ended since) up to `now`; the
    number of jobs booked. Jobs from before the ledger get their rows the first time."""
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
            rows = list(s.scalars(select(LedgerRow).where(LedgerRow.job_id == j.id)
                                  .order_by(LedgerRow.id)))
            delta = micro(job_cost_usd(j, c, now)) - sum(r.micro_usd for r in rows)
            start, end = _job_window(j, c, now)
            last = next((r for r in reversed(rows) if r.open), None)
            same = (last is not None and last.usd_per_hour == c.usd_per_hour
                    and last.price_book == c.price_book and last.devices == c.count
                    and month_start(last.start) == month_start(end))
            if last is not None and same:
                last.micro_usd += delta
                last.end = end
            else:
                if last is not None:
                    last.open = False
                if delta != 0 or not rows:
                    s.add(LedgerRow(job_id=j.id, job=j.name, user=j.user or fallback,
                                    team=j.team, gpu=c.gpu, devices=c.count,
                                    price_book=c.price_book, usd_per_hour=c.usd_per_hour,
                                    start=rows[-1].end if rows else start, end=end,
                                    micro_usd=delta, open=True))
            if j.status not in JOB_ACTIVE:
                s.flush()
                for r in s.scalars(select(LedgerRow).where(LedgerRow.job_id == j.id,
                                                           LedgerRow.open.is_(True))):
                    r.open = False
            booked += 1
    return booked


def spent_since(store: Store, since: float) -> dict[str, float]:
    """Each team's dollars in rows that accrued since `since` (a month's start)."""
    with store.read() as s:
        found = s.execute(select(LedgerRow.team, func.sum(LedgerRow.micro_usd))
                          .where(LedgerRow.end >= since, LedgerRow.team.is_not(None))
                          .group_by(LedgerRow.team)).all()
    return {team: int(total) / MICRO for team, total in found if team is not None}


def rows(store: Store, since: float | None = None, user: str | None = None,
         team: str | None = None) -> list[LedgerRow]:
    q = select(LedgerRow).order_by(LedgerRow.id)
    if since is not None:
        q = q.where(LedgerRow.end >= since)
    if user is not None:
        q = q.where(LedgerRow.user == user)
    if team is not None:
        q = q.where(LedgerRow.team == team)
    with store.read() as s:
        return list(s.scalars(q))


def usage(found: Iterable[LedgerRow], by: str) -> dict[str, Any]:
    """Rows summed per user, team, GPU type or job: dollars, GPU-hours, jobs; and the total.
    Sums are of whole micro-dollars, so the groups add up to the total exactly."""
    groups: dict[str, dict[str, Any]] = {}
    total = 0
    hours = 0.0
    for r in found:
        key = str(getattr(r, by) or "-")
        g = groups.setdefault(key, {by: key, "micro_usd": 0, "gpu_hours": 0.0, "jobs": set()})
        g["micro_usd"] += r.micro_usd
        h = r.devices * max(0.0, r.end - r.start) / 3600.0
        g["gpu_hours"] += h
        g["jobs"].add(r.job)
        total += r.micro_usd
        hours += h
    out = []
    for g in sorted(groups.values(), key=lambda g: (-g["micro_usd"], g[by])):
        out.append({by: g[by], "usd": g["micro_usd"] / MICRO, "micro_usd": g["micro_usd"],
                    "gpu_hours": g["gpu_hours"], "jobs": len(g["jobs"])})
    return {"by": by, "groups": out, "usd": total / MICRO, "micro_usd": total,
            "gpu_hours": hours}
