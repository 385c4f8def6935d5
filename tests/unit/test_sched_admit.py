"""Admission (gpufleet.sched.admit): a team's GPU quota and monthly budget, alone and inside a
plan, where a held job holds up no one."""

from __future__ import annotations

from gpufleet.sched import admit
from gpufleet.sched.model import Limits, Plan, Resource, Running, Start, Wait, Waiting
from gpufleet.sched.plan import plan

NOW = 1_000_000.0
HOUR = 3600.0
CPU: Resource = ("local", "cpu")


def job(name: str, team: str | None = "t", count: int = 1, at: float = 0.0,
        dur: float | None = None, rate: float = 0.0, res: Resource = CPU) -> Waiting:
    return Waiting(name, "u", team, 0, at, res, count, duration_s=dur, usd_per_hour=rate)


def running(name: str, team: str | None = "t", count: int = 1, res: Resource = CPU) -> Running:
    return Running(name, "u", team, res, count, NOW - 10, None)


class Pool:
    """Free devices per resource; `fits` takes what it admits and records who asked."""

    def __init__(self, free: dict[Resource, int]):
        self.free = dict(free)
        self.asked: list[str] = []

    def fits(self, w: Waiting) -> bool:
        self.asked.append(w.name)
        if self.free.get(w.resource, 0) < w.count:
            return False
        self.free[w.resource] -= w.count
        return True


def decide(waiting: list[Waiting], limits: Limits, free: int = 8,
           run: tuple[Running, ...] = ()) -> tuple[Plan, Pool]:
    pool = Pool({CPU: free})
    return plan(waiting, run, {CPU: free}, pool.fits, limits, {}, NOW), pool


# never_fits


def test_a_job_over_its_quota_never_fits_and_says_so() -> None:
    limits = Limits(quotas={("t", "cpu"): 1})
    text = admit.never_fits(job("a", count=2), limits)
    assert text is not None
    assert text.startswith("count: ")
    assert "2 CPU slots" in text and "team t's quota is 1" in text
    assert "gpufleet admin quota set t cpu N" in text


def test_within_quota_no_quota_or_no_team_always_may_fit() -> None:
    limits = Limits(quotas={("t", "cpu"): 2})
    assert admit.never_fits(job("a", count=2), limits) is None
    assert admit.never_fits(job("a", count=9, res=("local", "a100")), limits) is None
    assert admit.never_fits(job("a", team="other", count=9), limits) is None
    assert admit.never_fits(job("a", team=None, count=9), limits) is None


# quota_problem


def test_quota_counts_what_is_in_use() -> None:
    limits = Limits(quotas={("t", "cpu"): 3})
    assert admit.quota_problem(job("a", count=2), {("t", "cpu"): 1}, limits) is None
    text = admit.quota_problem(job("a", count=2), {("t", "cpu"): 2}, limits)
    assert text == ("team t's quota is 3 CPU slots at once and 2 are in use; it starts when the "
                    "team's jobs free them")
    assert admit.quota_problem(job("a", count=2), {("t", "a100"): 3}, limits) is None


def test_quota_one_job_runs_the_next_is_held_and_another_team_is_not_blocked() -> None:
    limits = Limits(quotas={("t", "cpu"): 1})
    waiting = [job("t1", at=1), job("t2", at=2), job("o1", team="o", at=3)]
    p, pool = decide(waiting, limits)
    assert p.starts == (Start("t1"), Start("o1"))  # o1 is not a backfill: nothing waits for cpu
    held = p.held_of("t2")
    assert held is not None and held.wait is Wait.QUOTA and held.position == 1
    assert held.est_start is None
    assert "team t" in held.text and "quota is 1 CPU slot" in held.text and "1 are in use" in held.text
    assert pool.asked == ["t1", "o1"]  # fits is never asked for a job over its quota


def test_running_jobs_count_toward_the_quota_on_any_pool() -> None:
    limits = Limits(quotas={("t", "cpu"): 2})
    run = (running("r1"), running("r2", res=("other", "cpu")))
    p, pool = decide([job("a", at=1), job("b", team=None, at=2)], limits, run=run)
    assert p.starts == (Start("b"),)
    assert [(h.name, h.wait) for h in p.held] == [("a", Wait.QUOTA)]
    assert pool.asked == ["b"]


def test_a_job_held_by_quota_is_no_head_for_backfill() -> None:
    """t2 (2 cpu) is over t's quota; o1 behind it fits the one free device: it starts as a plain
    start, and is not made to wait behind t2."""
    limits = Limits(quotas={("t", "cpu"): 2})
    p, _ = decide([job("t2", count=2, at=1), job("o1", team="o", at=2)], limits, free=1,
                  run=(running("r", count=1),))
    assert p.starts == (Start("o1", backfilled=False),)
    assert [(h.name, h.wait) for h in p.held] == [("t2", Wait.QUOTA)]


def test_a_smaller_job_of_the_same_team_may_start_within_the_quota() -> None:
    limits = Limits(quotas={("t", "cpu"): 3})
    p, _ = decide([job("a", count=2, at=1), job("big", count=2, at=2), job("small", at=3)],
                  limits)
    assert [s.name for s in p.starts] == ["a", "small"]
    assert [(h.name, h.wait, h.position) for h in p.held] == [("big", Wait.QUOTA, 1)]


# budget_problem


def test_spent_budget_holds_and_names_the_budget() -> None:
    limits = Limits(budget_left={"t": 0.0}, budget_of={"t": 100.0})
    text = admit.budget_problem(job("a"), limits.budget_left, limits)
    assert text == ("team t has spent its $100.00 monthly budget this month; an admin can raise "
                    "it (gpufleet admin budget set t USD) or it waits for next month")
    overspent = Limits(budget_left={"t": -3.5})
    assert admit.budget_problem(job("a"), overspent.budget_left, overspent) == (
        "team t has spent its budget this month; an admin can raise it (gpufleet admin budget "
        "set t USD) or it waits for next month")


def test_a_job_that_may_cost_more_than_is_left_is_held() -> None:
    limits = Limits(budget_left={"t": 10.0}, budget_of={"t": 100.0})
    left = limits.budget_left
    assert admit.budget_problem(job("a", dur=2 * HOUR, rate=5.0), left, limits) is None  # $10
    text = admit.budget_problem(job("a", dur=2 * HOUR, rate=6.0), left, limits)
    assert text == ("it may cost up to $12.00 over its time limit; team t has $10.00 left of its "
                    "$100.00 monthly budget this month")


def test_without_a_time_limit_a_job_is_admitted_while_anything_is_left() -> None:
    limits = Limits(budget_left={"t": 0.01})
    assert admit.budget_problem(job("a", rate=1000.0), limits.budget_left, limits) is None


def test_teams_without_a_budget_and_jobs_without_a_team_are_never_held_by_it() -> None:
    limits = Limits(budget_left={"t": 0.0})
    assert admit.budget_problem(job("a", team="o", dur=HOUR, rate=1e6), limits.budget_left,
                                limits) is None
    assert admit.budget_problem(job("a", team=None, dur=HOUR, rate=1e6), limits.budget_left,
                                limits) is None


def test_budget_in_a_plan_counts_what_this_pass_started() -> None:
    """$10 left: a ($8 over its limit) starts, b ($4) would overspend the $2 that remain, c (no
    time limit) is admitted while something is left, o's team has no budget."""
    limits = Limits(budget_left={"t": 10.0}, budget_of={"t": 50.0})
    waiting = [job("a", dur=2 * HOUR, rate=4.0, at=1), job("b", dur=HOUR, rate=4.0, at=2),
               job("c", rate=4.0, at=3), job("o", team="o", dur=HOUR, rate=1e6, at=4)]
    p, pool = decide(waiting, limits)
    assert [s.name for s in p.starts] == ["a", "c", "o"]
    held = p.held_of("b")
    assert held is not None and held.wait is Wait.BUDGET and held.position == 1
    assert held.est_start is None
    assert "$4.00" in held.text and "$2.00 left" in held.text
    assert pool.asked == ["a", "c", "o"]


def test_spent_budget_holds_every_job_of_the_team_but_no_one_else() -> None:
    limits = Limits(budget_left={"t": 0.0})
    p, _ = decide([job("a", at=1), job("b", at=2), job("o", team="o", at=3)], limits, free=1)
    assert p.starts == (Start("o"),)
    assert [(h.name, h.wait, h.position) for h in p.held] == [("a", Wait.BUDGET, 1),
                                                             ("b", Wait.BUDGET, 2)]


def test_quota_is_checked_before_budget() -> None:
    limits = Limits(quotas={("t", "cpu"): 0}, budget_left={"t": 0.0})
    p, _ = decide([job("a")], limits)
    assert [(h.name, h.wait) for h in p.held] == [("a", Wait.QUOTA)]


def test_a_job_that_may_cost_more_than_the_whole_budget_never_fits() -> None:
    limits = Limits(budget_left={"t": 10.0}, budget_of={"t": 10.0})
    costly = job("a", dur=3 * 3600.0, rate=4.0)  # up to $12 of a $10 budget
    text = admit.never_fits(costly, limits)
    assert text is not None and text.startswith("time_limit: ")
    assert "$12.00" in text and "$10.00" in text
    assert admit.never_fits(job("a", dur=3600.0, rate=4.0), limits) is None
    assert admit.never_fits(job("a", rate=4.0), limits) is None  # no limit: not known
