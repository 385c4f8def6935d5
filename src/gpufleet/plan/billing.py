"""Who pays for each second a cluster is reserved, in whole micro-dollars. Pure: records and
`now` in, amounts out.

A cluster's cost so far (`cost.accrued_usd`, what `list` and `stop` show) is a meter that only
goes up. gpufleet reads it, rounded to the micro-dollar (`meter_micro`), when a run of a job on
the cluster begins and when it ends, and keeps both readings (the store's `JobRun`). Every
amount below is a difference of readings, so every sum telescopes and is exact:

- a run costs its end reading minus its start reading (an open run: the meter now, minus);
- a job costs the sum of all its runs, on every cluster it ran on: a resume on a new cluster
  adds a run; restarts and resizes happen within one (a resize changes the meter's rate);
- a cluster's idle time (reserved, no job running on it) costs its meter minus its runs.

So a cluster's runs and its idle time add up to what `list` shows for it, and the ledger books
exactly these amounts (`dues`, `post`): a job's rows add up to its cost, a cluster's rows to
its cost, and every reserved second is in exactly one row.

A run on a cluster made for its job (by `run`, or by `run --resume`) starts at the cluster's
first second (reading 0) and, unless the job keeps its cluster (`--keep`), ends when the
cluster stops: such a cluster exists only for the job, so the job costs what its clusters cost.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from gpufleet.plan import cost

MICRO = 1_000_000
Span = tuple[float, float]  # (start, end), UNIX seconds


def micro(usd: float) -> int:
    return round(usd * MICRO)


class Meter(Protocol):
    """A cluster's fields its cost is computed from (store.Cluster)."""

    @property
    def usd_per_hour(self) -> float: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def stopped_at(self) -> float | None: ...
    @property
    def banked_usd(self) -> float | None: ...
    @property
    def rate_since(self) -> float | None: ...


class Billed(Protocol):
    """A job's fields its cost is computed from (store.Job)."""

    @property
    def billed_micro_usd(self) -> int | None: ...
    @property
    def run_from_micro_usd(self) -> int | None: ...


def meter_micro(c: Meter, at: float) -> int:
    """The cluster's cost from its start to `at` (frozen at its stop), rounded to the
    micro-dollar: what `list` shows at `at`."""
    if c.started_at is None:
        return 0
    stopped = c.stopped_at if c.stopped_at is not None and c.stopped_at <= at else None
    return micro(cost.accrued_usd(c.usd_per_hour, c.started_at, stopped, at,
                                  c.banked_usd or 0.0, c.rate_since))


def job_micro(job: Billed, c: Meter, now: float) -> int:
    """What a job cost: its ended runs, plus its open run on `c` (the cluster it is on now)."""
    done = job.billed_micro_usd or 0
    if job.run_from_micro_usd is None:
        return done
    return done + meter_micro(c, now) - job.run_from_micro_usd


def job_cost_usd(job: Billed, c: Meter, now: float) -> float:
    """What the job cost in dollars, over all its runs on every cluster it ran on: exactly its
    ledger rows; `c` is the cluster it is on now. A cluster made for the job is the job's from
    its start to its stop; on a cluster launched apart, the time before and after the job is
    the cluster's idle time (`list` shows the cluster's whole cost). Every screen's job cost."""
    return job_micro(job, c, now) / MICRO


def run_start(c: Meter, now: float, fresh: bool) -> tuple[float, int]:
    """When a run that begins at `now` on `c` starts, and the meter's reading then; `fresh`: the
    cluster was made for this run of its job, which so counts from the cluster's first second."""
    return ((c.started_at if c.started_at is not None else now), 0) if fresh \
        else (now, meter_micro(c, now))


@dataclass(frozen=True)
class Run:
    """A job's stretch on a cluster with the meter's readings at both ends (store.JobRun)."""

    job_id: int
    start: float
    end: float | None  # None: still running
    from_micro: int
    to_micro: int | None


def run_micro(run: Run, c: Meter, now: float) -> int:
    return (run.to_micro if run.to_micro is not None else meter_micro(c, now)) - run.from_micro


@dataclass(frozen=True)
class Due:
    """What the rows of one account of a cluster must add up to now, and when it accrued: a
    job's (`job_id`: its runs on the cluster) or the cluster's idle time (`job_id` None)."""

    job_id: int | None
    micro_usd: int
    spans: tuple[Span, ...]  # oldest first; empty when it has had no time yet
    start: float
    final: bool  # nothing will be added: the runs ended (and, for idle time, the cluster stopped)


def dues(c: Meter, runs: Iterable[Run], now: float) -> list[Due]:
    """Each account of the cluster (every job that ran on it, then its idle time) with what it
    is due now; `runs`: every run on the cluster. The amounts add up to `meter_micro(c, now)`."""
    if c.started_at is None:
        return []
    end = min(now, c.stopped_at) if c.stopped_at is not None else now
    by_job: dict[int, list[Run]] = {}
    for r in runs:
        by_job.setdefault(r.job_id, []).append(r)
    out: list[Due] = []
    taken: list[Span] = []
    for job_id, rs in by_job.items():
        rs.sort(key=lambda r: r.start)
        spans = [(r.start, max(r.start, r.end if r.end is not None else end)) for r in rs]
        taken += spans
        out.append(Due(job_id, sum(run_micro(r, c, now) for r in rs),
                       tuple(s for s in spans if s[1] > s[0]), rs[0].start,
                       all(r.end is not None for r in rs)))
    idle = meter_micro(c, now) - sum(d.micro_usd for d in out)
    closed = c.stopped_at is not None and all(d.final for d in out)
    out.append(Due(None, idle, tuple(minus((c.started_at, end), taken)), c.started_at, closed))
    return out


def minus(span: Span, holes: Iterable[Span]) -> list[Span]:
    """The parts of `span` outside every hole."""
    parts = [span]
    for a, b in sorted(holes):
        nxt: list[Span] = []
        for x, y in parts:
            if b <= x or a >= y:
                nxt.append((x, y))
                continue
            if a > x:
                nxt.append((x, a))
            if b < y:
                nxt.append((b, y))
        parts = nxt
    return [p for p in parts if p[1] > p[0]]


def month_start(t: float) -> float:
    g = time.gmtime(t)
    return float(calendar.timegm((g.tm_year, g.tm_mon, 1, 0, 0, 0)))


def _next_month(t: float) -> float:
    g = time.gmtime(t)
    year, month = (g.tm_year + 1, 1) if g.tm_mon == 12 else (g.tm_year, g.tm_mon + 1)
    return float(calendar.timegm((year, month, 1, 0, 0, 0)))


def spread(spans: Sequence[Span], micro_usd: int) -> list[tuple[float, float, int]]:
    """`micro_usd` accrued evenly over `spans`, as (start, end, amount) cut at each UTC month
    start, so each month's rows hold only that month's cost. The amounts add up to `micro_usd`
    exactly and are in proportion to time: exact for one rate, as between two accruals on a
    server; an account first booked long after its time is spread over that time."""
    cut: list[Span] = []
    for t0, t1 in spans:
        at = t0
        m = _next_month(t0)
        while m < t1:
            cut.append((at, m))
            at, m = m, _next_month(m)
        cut.append((at, t1))
    total = sum(b - a for a, b in cut)
    if total <= 0:
        return []
    out = []
    before = 0.0
    booked = 0
    for i, (a, b) in enumerate(cut):
        before += b - a
        upto = micro_usd if i == len(cut) - 1 else round(micro_usd * before / total)
        out.append((a, b, upto - booked))
        booked = upto
    return out


def by_month(t0: float, t1: float, micro_usd: int) -> list[tuple[float, float, int]]:
    """`spread` over one span; a span that is empty or backwards (a correction: a job's end
    recorded late) is one piece as it is."""
    if t1 <= t0:
        return [(t0, t1, micro_usd)]
    return spread([(t0, t1)], micro_usd)


@dataclass(frozen=True)
class Rate:
    """What a row is billed at: a change of any of these opens a new row."""

    usd_per_hour: float
    price_book: str | None
    devices: int


@dataclass(frozen=True)
class Line:
    """A ledger row as booking sees it."""

    start: float
    end: float
    micro_usd: int
    rate: Rate
    open: bool = True


@dataclass(frozen=True)
class Posting:
    last: Line | None  # the account's newest row as it is now (None: it had none)
    new: tuple[Line, ...]  # rows to add after it


def post(last: Line | None, booked: int, due: Due, rate: Rate, keep_zero: bool) -> Posting:
    """Book what `due` adds to an account whose rows hold `booked` and end with `last`: the
    difference goes over the account's time since `last` ended, into `last` while it is open,
    at the same rate, in its month and straight after it, else into new rows. Every second of
    the account's time gets into a row, even at $0 (GPU-hours count reserved time); `keep_zero`:
    an account with no time yet gets a row of $0 (a job just started shows in usage)."""
    since = last.end if last is not None else due.start
    pieces = spread(clip(due.spans, since), due.micro_usd - booked) \
        or [(since, since, due.micro_usd - booked)]
    lines = [last] if last is not None else []
    for a, b, amount in pieces:
        tail = lines[-1] if lines else None
        if tail is not None and tail.open and tail.rate == rate and a <= tail.end \
                and month_start(tail.start) == month_start(a):
            lines[-1] = replace(tail, micro_usd=tail.micro_usd + amount, end=max(tail.end, b))
            continue
        if tail is not None and tail.open:
            lines[-1] = replace(tail, open=False)
        if b > a or amount != 0 or (keep_zero and not lines):  # time (even free), or money
            lines.append(Line(a, max(a, b), amount, rate))
    if due.final:
        lines = [replace(line, open=False) for line in lines]
    if last is None:
        return Posting(None, tuple(lines))
    return Posting(lines[0], tuple(lines[1:]))


def clip(spans: Iterable[Span], since: float, until: float = math.inf) -> list[Span]:
    out = []
    for a, b in spans:
        a, b = max(a, since), min(b, until)
        if b > a:
            out.append((a, b))
    return out

