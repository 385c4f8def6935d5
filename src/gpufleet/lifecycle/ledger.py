"""The billing ledger: every second each cluster was reserved, as rows of (job, or none for
idle time; user, team, cluster, price book, rate, period, micro-dollars), and usage summed from
them.

What each row holds comes from `plan.billing`: for each cluster, each job that ran on it (the
cost meter's readings at its runs' ends) and the cluster's idle time (the rest of its meter).
`accrue` books what each of them gained since the last time, over the time it accrued, in the
open row while the rate, the book, the calendar month and the time run on, in a new row when
any of them changes (an interval that spans a UTC month start is cut there). So:

- a cluster's rows add up to its cost as `list` and `stop` show it, to the micro-dollar;
- a job's rows add up to its cost as every screen shows it (`plan.billing.job_cost_usd`),
  over all its runs: a resume on a new cluster, restarts, resizes, a supervisor killed before
  anything was booked (its run is closed by `reconcile` from what is stored);
- idle rows (no job) are billed to the cluster's owner (who launched it or whose job it was
  made for; the OS user without a server) and the owner's team, and count against its budget;
- a month's spend is its rows, and no sum is off by the float rounding of many additions.

A stopped cluster, once booked in full, is settled and not read again. Rows booked before
clusters had rows of their own (revision 0005) name no cluster and stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from gpufleet.lifecycle import accounts
from gpufleet.plan import billing
from gpufleet.plan.billing import MICRO, by_month, micro, month_start
from gpufleet.status import CLUSTER_ACTIVE
from gpufleet.store import Cluster, Job, JobRun, LedgerRow, Store, User

GROUPS = ("user", "team", "gpu", "job")
IDLE = "(idle)"  # what `usage --by job` calls a cluster's idle time: "(idle) CLUSTER"

__all__ = ["GROUPS", "IDLE", "MICRO", "accrue", "by_month", "in_window", "micro", "month_start",
           "rows", "spent_since", "usage"]

T = TypeVar("T")


def _where_in(s: Session, entity: type[T], column: InstrumentedAttribute[Any],
              ids: Sequence[int]) -> list[T]:
    out: list[T] = []
    for at in range(0, len(ids), 500):  # well under SQLite's limit on query parameters
        out += s.scalars(select(entity).where(column.in_(ids[at:at + 500]))
                         .order_by(entity.id))  # type: ignore[attr-defined]
    return out


def _line(r: LedgerRow) -> billing.Line:
    return billing.Line(r.start, r.end, r.micro_usd,
                        billing.Rate(r.usd_per_hour, r.price_book, r.devices), r.open)


def accrue(store: Store, now: float) -> int:
    """Bring the rows of every cluster not yet settled (running, or stopped since it was last
    booked) up to `now`; the number of clusters booked."""
    fallback = accounts.os_user()
    with store.session() as s:
        found = [c for c in s.scalars(select(Cluster).where(Cluster.settled.is_not(True))
                                      .order_by(Cluster.id)) if c.started_at is not None]
        ids = [c.id for c in found]
        runs: dict[int, list[billing.Run]] = {}
        for r in _where_in(s, JobRun, JobRun.cluster_id, ids):
            runs.setdefault(r.cluster_id, []).append(
                billing.Run(r.job_id, r.start, r.end, r.from_micro_usd, r.to_micro_usd))
        jobs = {j.id: j for j in _where_in(s, Job, Job.id,
                                           sorted({r.job_id for rs in runs.values() for r in rs}))}
        booked, last = _accounts(s, ids)
        team_of = {name: team for name, team in s.execute(select(User.name, User.team))}
        for c in found:
            dues = billing.dues(c, runs.get(c.id, []), now)
            for due in dues:
                payer: tuple[str | None, str, str | None]
                if due.job_id is not None:
                    j = jobs[due.job_id]
                    payer = (j.name, j.user or fallback, j.team)
                else:  # idle time: the owner's
                    payer = (None, c.user or fallback, team_of.get(c.user or fallback))
                key = (c.id, due.job_id)
                _book(s, c, due, last.get(key), booked.get(key, 0), payer)
            if c.status not in CLUSTER_ACTIVE and all(d.final for d in dues):
                c.settled = True
    return len(found)


Account = tuple[int, int | None]  # (cluster id, job id; None: the cluster's idle time)


def _accounts(s: Session, ids: Sequence[int]) -> tuple[dict[Account, int], dict[Account, LedgerRow]]:
    """What the rows of each account of these clusters add up to, and each account's newest
    row (the only one that may still be open), without reading every row of a long-lived
    cluster."""
    booked: dict[Account, int] = {}
    newest: list[int] = []
    for at in range(0, len(ids), 500):
        for cid, jid, total, top in s.execute(
                select(LedgerRow.cluster_id, LedgerRow.job_id, func.sum(LedgerRow.micro_usd),
                       func.max(LedgerRow.id))
                .where(LedgerRow.cluster_id.in_(ids[at:at + 500]))
                .group_by(LedgerRow.cluster_id, LedgerRow.job_id)):
            if cid is not None:  # always: the query asked for these clusters
                booked[(cid, jid)] = int(total)
                newest.append(top)
    last = {(r.cluster_id, r.job_id): r for r in _where_in(s, LedgerRow, LedgerRow.id, newest)
            if r.cluster_id is not None}
    return booked, last


def _book(s: Session, c: Cluster, due: billing.Due, last: LedgerRow | None, booked: int,
          payer: tuple[str | None, str, str | None]) -> None:
    """Post `due` to the account whose rows add up to `booked` and end with `last`; `payer`:
    the rows' job (None: idle time), user and team."""
    got = billing.post(_line(last) if last is not None else None, booked, due,
                       billing.Rate(c.usd_per_hour, c.price_book, c.billed_devices),
                       keep_zero=due.job_id is not None)
    if last is not None and got.last is not None:
        last.micro_usd, last.end, last.open = got.last.micro_usd, got.last.end, got.last.open
    job, user, team = payer
    for new in got.new:
        s.add(LedgerRow(job_id=due.job_id, job=job, cluster_id=c.id, cluster=c.name, user=user,
                        team=team, gpu=c.gpu, devices=new.rate.devices,
                        price_book=new.rate.price_book, usd_per_hour=new.rate.usd_per_hour,
                        start=new.start, end=new.end, micro_usd=new.micro_usd, open=new.open))


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
    """Rows summed per user, team, GPU type or job: dollars, GPU-hours (reserved: idle time
    counts), jobs; and the total, counting from `since` (None: whole rows). By job, a
    cluster's idle time is its own group, "(idle) CLUSTER". Sums are of whole micro-dollars,
    so the groups add up to the total exactly."""
    groups: dict[str, dict[str, Any]] = {}
    total = 0
    hours = 0.0
    for r in found:
        micro_usd, seconds = in_window(r, since)
        key = f"{IDLE} {r.cluster or '-'}" if by == "job" and r.job is None else \
            str(getattr(r, by) or "-")
        g = groups.setdefault(key, {by: key, "micro_usd": 0, "gpu_hours": 0.0, "jobs": set()})
        g["micro_usd"] += micro_usd
        h = r.devices * seconds / 3600.0
        g["gpu_hours"] += h
        if r.job is not None:
            g["jobs"].add(r.job)
        total += micro_usd
        hours += h
    out = []
    for g in sorted(groups.values(), key=lambda g: (-g["micro_usd"], g[by])):
        out.append({by: g[by], "usd": g["micro_usd"] / MICRO, "micro_usd": g["micro_usd"],
                    "gpu_hours": g["gpu_hours"], "jobs": len(g["jobs"])})
    return {"by": by, "groups": out, "usd": total / MICRO, "micro_usd": total,
            "gpu_hours": hours}
