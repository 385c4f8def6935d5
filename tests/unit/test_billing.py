"""plan.billing on constructed histories: every reserved second of a cluster is in exactly one
ledger row (a job's while it runs, the cluster's idle time otherwise), a cluster's rows add up
to its cost, and a job's rows to its cost over all its runs, to the micro-dollar: across a
resume on a new cluster, a resize that changes the rate, idle gaps, a month start and a
supervisor that died before anything was booked; booked once at the end or every few seconds.

`World` keeps the records as the store does (lifecycle/job_runs.py: a run's start and end
readings of its cluster's meter) and books as `ledger.accrue` does, with plain data."""

from __future__ import annotations

import calendar
import itertools
import random
from dataclasses import dataclass, field, replace

import pytest

from gpufleet.plan import billing
from gpufleet.plan.cost import accrued_usd

FEB = float(calendar.timegm((2030, 2, 1, 0, 0, 0)))  # a UTC month start
T0 = FEB - 3 * 3600.0


@dataclass(frozen=True)
class Meter:
    usd_per_hour: float
    started_at: float | None
    stopped_at: float | None = None
    banked_usd: float | None = 0.0
    rate_since: float | None = None


@dataclass
class JobRec:
    cluster: str = ""
    billed_micro_usd: int = 0
    run_from_micro_usd: int | None = None


@dataclass
class RunRec:
    job: int
    cluster: str
    start: float
    from_micro: int
    end: float | None = None
    to_micro: int | None = None


@dataclass
class World:
    clusters: dict[str, Meter] = field(default_factory=dict)
    jobs: dict[int, JobRec] = field(default_factory=dict)
    runs: list[RunRec] = field(default_factory=list)
    lines: dict[tuple[str, int | None], list[billing.Line]] = field(default_factory=dict)
    settled: set[str] = field(default_factory=set)
    booked_at: float | None = None

    def launch(self, name: str, rate: float, at: float) -> None:
        self.clusters[name] = Meter(rate, at)

    def start(self, job: int, cluster: str, at: float, fresh: bool = False) -> None:
        """A job created or resumed on `cluster` (`fresh`: the cluster was made for it)."""
        j = self.jobs.setdefault(job, JobRec())
        assert j.run_from_micro_usd is None
        start, reading = billing.run_start(self.clusters[cluster], at, fresh)
        j.cluster, j.run_from_micro_usd = cluster, reading
        self.runs.append(RunRec(job, cluster, start, reading))

    def end(self, job: int, at: float) -> None:
        """The job's run ends (the job ended on a shared cluster, or its own cluster stopped)."""
        j = self.jobs[job]
        if j.run_from_micro_usd is None:
            return
        reading = billing.meter_micro(self.clusters[j.cluster], at)
        run = next(r for r in self.runs if r.job == job and r.end is None)
        run.end, run.to_micro = at, reading
        j.billed_micro_usd += reading - j.run_from_micro_usd
        j.run_from_micro_usd = None

    def stop(self, cluster: str, at: float) -> None:
        self.clusters[cluster] = replace(self.clusters[cluster], stopped_at=at)
        for job, j in self.jobs.items():
            if j.cluster == cluster:
                self.end(job, at)

    def resize(self, cluster: str, at: float, rate: float) -> None:
        """As clusters._rebill: bank the cost at the old rate, bill the new one from `at`."""
        c = self.clusters[cluster]
        banked = accrued_usd(c.usd_per_hour, c.started_at, None, at, c.banked_usd or 0.0,
                             c.rate_since)
        self.clusters[cluster] = replace(c, banked_usd=banked, rate_since=at, usd_per_hour=rate)

    def book(self, now: float) -> None:
        """As ledger.accrue: every cluster not settled, every account of it."""
        ids = {name: i for i, name in enumerate(self.clusters)}
        for name, c in self.clusters.items():
            if name in self.settled:
                continue
            runs = [billing.Run(r.job, r.start, r.end, r.from_micro, r.to_micro)
                    for r in self.runs if r.cluster == name]
            dues = billing.dues(c, runs, now)
            for due in dues:
                have = self.lines.setdefault((name, due.job_id), [])
                got = billing.post(have[-1] if have else None,
                                   sum(x.micro_usd for x in have), due,
                                   billing.Rate(c.usd_per_hour, "book", 2 + ids[name]),
                                   keep_zero=due.job_id is not None)
                if got.last is not None:
                    have[-1] = got.last
                have.extend(got.new)
            if c.stopped_at is not None and all(d.final for d in dues):
                self.settled.add(name)
        self.booked_at = now

    # -- what must hold ---------------------------------------------------------------------
    def cluster_rows(self, cluster: str) -> list[billing.Line]:
        return [x for (c, _), xs in self.lines.items() if c == cluster for x in xs]

    def job_rows(self, job: int) -> list[billing.Line]:
        return [x for (_, j), xs in self.lines.items() if j == job for x in xs]

    def idle_rows(self, cluster: str) -> list[billing.Line]:
        return self.lines.get((cluster, None), [])

    def check(self) -> None:
        """The ledger as just booked against every cluster's and job's cost at that moment."""
        now = self.booked_at
        assert now is not None
        for name, c in self.clusters.items():
            assert sum(x.micro_usd for x in self.cluster_rows(name)) == \
                billing.meter_micro(c, now), name
            spans = sorted((x.start, x.end) for x in self.cluster_rows(name))
            for (_, end), (start, _) in itertools.pairwise(spans):
                assert start >= end, f"{name}: two rows hold the same second"
            life = (c.stopped_at if c.stopped_at is not None else now) - (c.started_at or now)
            assert sum(b - a for a, b in spans) == pytest.approx(life), name
            for x in self.cluster_rows(name):
                assert billing.month_start(x.start) == billing.month_start(max(x.start, x.end - 1e-6))
        for job, j in self.jobs.items():
            cost = billing.job_micro(j, self.clusters[j.cluster], now)
            assert sum(x.micro_usd for x in self.job_rows(job)) == cost, job


def meter(w: World, name: str) -> int:
    c = w.clusters[name]
    return billing.meter_micro(c, c.stopped_at if c.stopped_at is not None else 0.0)


def book_every(w: World, every: float | None, until: float, since: float = T0) -> None:
    """Book every `every` seconds up to `until` (None: only then), checking each time."""
    if every is not None:
        t = since
        while t < until:
            w.book(t)
            w.check()
            t += every
    w.book(until)
    w.check()


@pytest.mark.parametrize("every", [None, 7.0])
def test_a_job_killed_then_resumed_on_a_new_cluster_costs_both_its_clusters(
        every: float | None) -> None:
    """`run` makes c1 for job 1; its supervisor is killed at +100 s and nothing books; the
    next command notices at +130 s, ends the job and stops c1; `run --resume` makes c2."""
    w = World()
    w.launch("c1", 0.0446, T0)
    w.start(1, "c1", T0 + 1.7, fresh=True)
    book_every(w, every, T0 + 100.0)  # the kill: nothing records it
    w.stop("c1", T0 + 130.2)  # reconcile ends the job, then stops its cluster: the run ends
    w.launch("c2", 0.0446, T0 + 400.0)
    w.start(1, "c2", T0 + 403.9, fresh=True)
    book_every(w, every, T0 + 900.0, T0 + 400.0)
    w.stop("c2", T0 + 900.1)
    w.book(T0 + 1000.0)
    w.check()
    both = meter(w, "c1") + meter(w, "c2")
    assert billing.job_micro(w.jobs[1], w.clusters["c2"], T0 + 1000.0) == both
    assert sum(x.micro_usd for x in w.job_rows(1)) == both
    assert w.idle_rows("c1") == [] and w.idle_rows("c2") == []
    assert w.settled == {"c1", "c2"}


@pytest.mark.parametrize("every", [None, 5.0])
def test_a_launched_cluster_bills_its_idle_gaps_apart_from_its_jobs(every: float | None) -> None:
    w = World()
    w.launch("dev", 2.345, T0)
    t = T0 + 30.0
    gaps = [(T0, t)]
    for job in range(1, 5):
        w.start(job, "dev", t)
        if every is not None:
            book_every(w, every, t + 20.0, t)
        w.end(job, t + 20.0)
        gaps.append((t + 20.0, t + 45.0))
        t += 45.0
    w.stop("dev", t - 20.0)
    gaps[-1] = (gaps[-1][0], t - 20.0)
    book_every(w, every, t + 60.0, t)
    idle = w.idle_rows("dev")
    assert [(x.start, x.end) for x in idle] == gaps  # one row per gap, in its place
    jobs = sum(x.micro_usd for j in range(1, 5) for x in w.job_rows(j))
    assert jobs + sum(x.micro_usd for x in idle) == meter(w, "dev")
    assert sum(x.micro_usd for x in idle) == pytest.approx(
        billing.micro(2.345 * (30.0 + 3 * 25.0 + 5.0) / 3600), abs=4)
    assert not any(x.open for x in w.cluster_rows("dev"))


def test_a_resize_opens_a_row_at_the_new_rate_and_the_job_pays_both() -> None:
    """An elastic job (and its restarts, which keep the run) on its own cluster: 4 devices,
    then 3 from +600 s; booked every 5 s as a server does."""
    w = World()
    w.launch("el", 4.0, T0)
    w.start(1, "el", T0 + 2.0, fresh=True)
    book_every(w, 5.0, T0 + 600.0)
    w.resize("el", T0 + 600.0, 3.0)
    book_every(w, 5.0, T0 + 1200.0, T0 + 600.0)
    w.stop("el", T0 + 1200.0)
    w.book(T0 + 1201.0)
    w.check()
    rows = w.job_rows(1)
    assert [x.rate.usd_per_hour for x in rows] == [4.0, 3.0]
    assert sum(x.micro_usd for x in rows) == billing.micro(4.0 * 600 / 3600 + 3.0 * 600 / 3600)


def test_rows_are_cut_at_a_month_start_idle_and_job_alike() -> None:
    w = World()
    w.launch("m", 3.6, FEB - 600.0)  # $0.001 a second
    w.start(1, "m", FEB - 300.0)
    w.end(1, FEB + 300.0)
    w.stop("m", FEB + 900.0)
    w.book(FEB + 1000.0)  # once, long after
    w.check()
    job = [(x.start, x.end, x.micro_usd) for x in w.job_rows(1)]
    assert job == [(FEB - 300.0, FEB, 300_000), (FEB, FEB + 300.0, 300_000)]
    idle = [(x.start, x.end, x.micro_usd) for x in w.idle_rows("m")]
    assert idle == [(FEB - 600.0, FEB - 300.0, 300_000), (FEB + 300.0, FEB + 900.0, 600_000)]


def test_a_dead_supervisor_on_a_shared_cluster_bills_the_job_until_it_is_noticed() -> None:
    """kill -9 at +50 s on a launched cluster; nothing books until `jobs` reconciles at
    +80 s: the job held the cluster until then, and the cluster is idle after."""
    w = World()
    w.launch("dev", 0.0446, T0)
    w.start(1, "dev", T0 + 10.0)
    w.end(1, T0 + 80.0)
    w.book(T0 + 100.0)
    w.check()
    assert [(x.start, x.end) for x in w.job_rows(1)] == [(T0 + 10.0, T0 + 80.0)]
    assert [(x.start, x.end) for x in w.idle_rows("dev")] == [(T0, T0 + 10.0),
                                                              (T0 + 80.0, T0 + 100.0)]
    assert w.idle_rows("dev")[-1].open, "the cluster still runs: its idle row grows"


def test_a_simulated_cluster_books_rows_of_zero_for_its_job_and_its_idle_time() -> None:
    """Nothing billed, but the reserved time is in rows (usage counts its GPU-hours)."""
    w = World()
    w.launch("sim", 0.0, T0)
    w.start(1, "sim", T0 + 5.0)
    w.book(T0 + 60.0)
    w.book(T0 + 120.0)
    w.check()
    assert [(x.micro_usd, x.start, x.end) for x in w.job_rows(1)] == [(0, T0 + 5.0, T0 + 120.0)]
    assert [(x.micro_usd, x.start, x.end) for x in w.idle_rows("sim")] == [(0, T0, T0 + 5.0)]


def test_random_histories_keep_every_invariant_at_every_booking() -> None:
    """Launches, jobs on shared and own clusters, resumes, resizes, stops and bookings in a
    random order (a fixed seed: the same histories every time)."""
    rng = random.Random(27)
    for _ in range(25):
        w = World()
        t = T0 + rng.uniform(0, 7200)
        next_job = 1
        for step in range(40):
            t += rng.choice((0.0, 0.3, 7.0, 61.0, 3600.0))
            live = [n for n, c in w.clusters.items() if c.stopped_at is None]
            idle = [n for n in live if not any(j.cluster == n and j.run_from_micro_usd is not None
                                               for j in w.jobs.values())]
            busy = [k for k, j in w.jobs.items() if j.run_from_micro_usd is not None]
            ended = [k for k, j in w.jobs.items() if j.run_from_micro_usd is None]
            move = rng.random()
            if move < 0.2 or not live:
                name = f"c{step}"
                w.launch(name, rng.choice((0.0446, 2.345, 31.7, 0.0)), t)
                if rng.random() < 0.5:  # made for a job: new, or resumed
                    job = rng.choice(ended) if ended and rng.random() < 0.5 else next_job
                    next_job += job == next_job
                    w.start(job, name, t + rng.uniform(0, 5), fresh=True)
            elif move < 0.4 and idle:
                job = rng.choice(ended) if ended and rng.random() < 0.3 else next_job
                next_job += job == next_job
                w.start(job, rng.choice(idle), t)
            elif move < 0.55 and busy:
                w.end(rng.choice(busy), t)
            elif move < 0.65:
                w.resize(rng.choice(live), t, rng.choice((1.5, 4.0, 0.0446)))
            elif move < 0.8:
                w.stop(rng.choice(live), t)
            w.book(t + rng.uniform(0, 2))
            w.check()
            t = w.booked_at or t


def test_minus_and_spread() -> None:
    assert billing.minus((0.0, 10.0), [(2.0, 3.0), (5.0, 12.0), (-1.0, 0.5)]) == \
        [(0.5, 2.0), (3.0, 5.0)]
    assert billing.minus((0.0, 10.0), []) == [(0.0, 10.0)]
    pieces = billing.spread([(FEB - 10.0, FEB + 10.0), (FEB + 20.0, FEB + 40.0)], 1001)
    assert [(a, b) for a, b, _ in pieces] == [(FEB - 10.0, FEB), (FEB, FEB + 10.0),
                                              (FEB + 20.0, FEB + 40.0)]
    assert sum(p[2] for p in pieces) == 1001 and [p[2] for p in pieces] == [250, 250, 501]
    assert billing.spread([], 5) == []
