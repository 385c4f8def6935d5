"""One pass of the queue (gpufleet.sched.plan): starts in order, gangs all or nothing, EASY
backfill behind one head per (pool, GPU type), estimated starts from time limits, and jobs on an
existing cluster. `fits` is a plain count over a dict of free devices that takes what it admits."""

from __future__ import annotations

import pytest

from gpufleet.sched.model import Held, Limits, Plan, Resource, Running, Start, Wait, Waiting
from gpufleet.sched.plan import plan

NOW = 1_000_000.0
A100: Resource = ("local", "a100")


def job(name: str, count: int = 1, at: float = 0.0, dur: float | None = None, priority: int = 0,
        cluster: str | None = None, res: Resource = A100) -> Waiting:
    return Waiting(name, "u", None, priority, at, res, count, cluster, dur)


def running(name: str, count: int = 1, ends_in: float | None = None,
            cluster: str | None = None, res: Resource = A100) -> Running:
    return Running(name, "u", None, res, count, NOW - 10,
                   None if ends_in is None else NOW + ends_in, cluster)


class Pool:
    def __init__(self, free: dict[Resource, int]):
        self.free = dict(free)
        self.asked: list[str] = []

    def fits(self, w: Waiting) -> bool:
        self.asked.append(w.name)
        if self.free.get(w.resource, 0) < w.count:
            return False
        self.free[w.resource] -= w.count
        return True


def decide(waiting: list[Waiting], run: tuple[Running, ...] = (), free: int = 0,
           counted: dict[Resource, int] | None = None) -> tuple[Plan, Pool]:
    """`counted`: the free counts the plan is told, when they differ from what fits finds."""
    pool = Pool({A100: free})
    told = counted if counted is not None else {A100: free}
    return plan(waiting, run, told, pool.fits, Limits(), {}, NOW), pool


def held(p: Plan) -> list[tuple[str, Wait, int, float | None]]:
    """(name, wait, position, est_start - NOW) of each held job, in order."""
    return [(h.name, h.wait, h.position, None if h.est_start is None else h.est_start - NOW)
            for h in p.held]


def one(p: Plan, name: str) -> Held:
    h = p.held_of(name)
    assert h is not None, name
    return h


def test_six_jobs_two_devices_start_in_priority_then_submission_order() -> None:
    waiting = [job("j1", at=1, dur=100), job("j2", priority=5, at=2, dur=100),
               job("j3", at=3, dur=100), job("j4", priority=5, at=4, dur=100),
               job("j5", at=5, dur=100), job("j6", priority=1, at=6, dur=100)]
    p, pool = decide(waiting, free=2)
    assert p.starts == (Start("j2"), Start("j4"))
    assert held(p) == [("j6", Wait.DEVICES, 1, 100.0), ("j1", Wait.BEHIND, 2, 100.0),
                       ("j3", Wait.BEHIND, 3, 200.0), ("j5", Wait.BEHIND, 4, 200.0)]
    assert one(p, "j6").text == "waits for 1 x a100 to be free (0 free now)"
    assert one(p, "j3").text == "behind the job at position 1, which is next for a100 devices"
    assert pool.free[A100] == 0


@pytest.mark.parametrize("free", range(8))
def test_never_more_starts_than_free_devices(free: int) -> None:
    p, pool = decide([job(f"j{i}", at=i) for i in range(6)], free=free)
    assert [s.name for s in p.starts] == [f"j{i}" for i in range(min(free, 6))]
    assert [h.position for h in p.held] == list(range(1, 6 - min(free, 6) + 1))
    assert pool.free[A100] == max(0, free - 6)


@pytest.mark.parametrize("dur, started, est", [(100.0, True, None), (101.0, False, 150.0),
                                               (None, False, 150.0)])
def test_a_gang_never_starts_on_fewer_devices_and_backfill_must_end_in_time(
        dur: float | None, started: bool, est: float | None) -> None:
    """1 free, 1 more freed at +100: the 2-device gang waits; a 1-device job starts now only if
    its time limit ends it by +100 (no device is spare at the gang's start)."""
    p, pool = decide([job("gang", count=2, at=1, dur=50), job("small", at=2, dur=dur)],
                     run=(running("r", 1, ends_in=100),), free=1)
    assert "gang" not in [s.name for s in p.starts]
    assert one(p, "gang").wait is Wait.DEVICES and one(p, "gang").est_start == NOW + 100
    if started:
        assert p.starts == (Start("small", backfilled=True),)
        assert pool.asked == ["gang", "small"] and pool.free[A100] == 0
    else:
        assert p.starts == ()
        assert held(p)[1] == ("small", Wait.BEHIND, 2, est)
        assert pool.asked == ["gang"] and pool.free[A100] == 1  # never asked: it may not start


def test_backfill_into_devices_spare_at_the_heads_start() -> None:
    """2 free, 2 more at +100, the head needs 3: one device is spare then. The first small job
    without a time limit takes it; the second must wait although a device is free now."""
    p, pool = decide([job("head", count=3, at=1, dur=50), job("s1", at=2), job("s2", at=3)],
                     run=(running("r", 2, ends_in=100),), free=2)
    assert p.starts == (Start("s1", backfilled=True),)
    assert held(p) == [("head", Wait.DEVICES, 1, 100.0), ("s2", Wait.BEHIND, 2, 150.0)]
    assert pool.asked == ["head", "s1"] and pool.free[A100] == 1


def test_without_time_limits_on_running_jobs_nothing_jumps_the_head() -> None:
    p, pool = decide([job("gang", count=2, at=1, dur=10), job("short", at=2, dur=1)],
                     run=(running("r", 1),), free=1)
    assert p.starts == ()
    assert held(p) == [("gang", Wait.DEVICES, 1, None), ("short", Wait.BEHIND, 2, None)]
    assert pool.free[A100] == 1


def test_estimates_come_from_running_jobs_time_limits() -> None:
    run = (running("r1", 2, ends_in=100), running("r2", 1, ends_in=300))
    p, _ = decide([job("three", count=3)], run=run)
    assert held(p) == [("three", Wait.DEVICES, 1, 300.0)]


def test_a_job_without_a_time_limit_keeps_its_devices_forever_in_the_estimate() -> None:
    """The head (no limit) takes r1's 2 devices at +100 for good: the 1-device job gets r2's at
    +300; a 2-device job would need the head's back, so it has no estimate."""
    run = (running("r1", 2, ends_in=100), running("r2", 1, ends_in=300))
    p, _ = decide([job("head", count=2, at=1), job("one", at=2, dur=10),
                   job("two", count=2, at=3, dur=10)], run=run)
    assert held(p) == [("head", Wait.DEVICES, 1, 100.0), ("one", Wait.BEHIND, 2, 300.0),
                       ("two", Wait.BEHIND, 3, None)]


def test_a_job_behind_the_head_is_estimated_after_it() -> None:
    """r2's devices are free at +50, but only the head has a promise: what waits behind it is
    estimated from the head's start on."""
    run = (running("r1", 2, ends_in=100), running("r2", 2, ends_in=50))
    p, _ = decide([job("head", count=4, at=1, dur=100), job("after", at=2, dur=30)], run=run)
    assert held(p) == [("head", Wait.DEVICES, 1, 100.0), ("after", Wait.BEHIND, 2, 200.0)]


@pytest.mark.parametrize("dur, est", [(60.0, 60.0), (None, None)])
def test_a_job_started_in_this_pass_frees_its_devices_by_its_time_limit(
        dur: float | None, est: float | None) -> None:
    p, _ = decide([job("first", at=1, dur=dur), job("next", at=2)], free=1)
    assert p.starts == (Start("first"),)
    assert held(p) == [("next", Wait.DEVICES, 1, est)]


def test_a_later_backfill_moves_the_estimate_of_a_job_held_before_it() -> None:
    """6 devices: 2 free, 4 at +100. The head takes 3 at +100 (3 spare). big (5) waits; then
    long (2, 1000 s) backfills into the spare ones. big's estimate must count long's devices:
    it gets 5 only when long ends, not when the head does."""
    p, _ = decide([job("head", count=3, at=1, dur=50), job("big", count=5, at=2, dur=10),
                   job("long", count=2, at=3, dur=1000)],
                  run=(running("r", 4, ends_in=100),), free=2)
    assert p.starts == (Start("long", backfilled=True),)
    assert held(p) == [("head", Wait.DEVICES, 1, 100.0), ("big", Wait.BEHIND, 2, 1000.0)]


def test_enough_counted_but_no_gang_shape_waits_for_the_next_end() -> None:
    """The counts say 2 are free but `fits` finds no place for the gang: it is estimated at the
    next end, or not at all when nothing ends."""
    p, _ = decide([job("gang", count=2)], run=(running("r", 1, ends_in=100),), free=1,
                  counted={A100: 2})
    assert held(p) == [("gang", Wait.DEVICES, 1, 100.0)]
    p, _ = decide([job("gang", count=2)], free=1, counted={A100: 2})
    assert held(p) == [("gang", Wait.DEVICES, 1, None)]


def test_a_running_job_past_its_time_limit_frees_its_devices_now_in_the_estimate() -> None:
    p, _ = decide([job("next", count=2, dur=10)], run=(running("late", 2, ends_in=-5),))
    assert held(p) == [("next", Wait.DEVICES, 1, 0.0)]


def test_a_negative_free_count_is_read_as_none_free() -> None:
    p, _ = decide([job("next", count=2)], run=(running("r", 2, ends_in=100),),
                  counted={A100: -2})
    assert held(p) == [("next", Wait.DEVICES, 1, 100.0)]
    assert one(p, "next").text == "waits for 2 x a100 to be free (0 free now)"


def test_a_start_the_counts_did_not_see_does_not_hide_a_later_end() -> None:
    """`fits` found a device the counts missed: what it took cannot make the count negative and
    swallow r's device freed at +100."""
    p, _ = decide([job("first", at=1), job("next", at=2)], run=(running("r", 1, ends_in=100),),
                  free=1, counted={A100: 0})
    assert p.starts == (Start("first"),)
    assert held(p) == [("next", Wait.DEVICES, 1, 100.0)]


def test_each_resource_has_its_own_head() -> None:
    h100: Resource = ("local", "h100")
    other: Resource = ("p2", "a100")
    pool = Pool({A100: 0, h100: 1, other: 1})
    waiting = [job("a", at=1), job("h", at=2, res=h100), job("o", at=3, res=other)]
    p = plan(waiting, (), dict(pool.free), pool.fits, Limits(), {}, NOW)
    assert p.starts == (Start("h"), Start("o"))
    assert held(p) == [("a", Wait.DEVICES, 1, None)]


# jobs on an existing cluster


def test_jobs_on_a_busy_cluster_wait_for_it_in_turn() -> None:
    run = (running("r", 2, ends_in=50, cluster="c"),)
    waiting = [job("w1", 2, at=1, dur=20, cluster="c"), job("w2", 2, at=2, cluster="c"),
               job("w3", 2, at=3, dur=5, cluster="c")]
    p, pool = decide(waiting, run=run, free=4)
    assert p.starts == ()
    assert held(p) == [("w1", Wait.CLUSTER, 1, 50.0), ("w2", Wait.CLUSTER, 2, 70.0),
                       ("w3", Wait.CLUSTER, 3, None)]
    assert one(p, "w1").text == "cluster c is running another job"
    assert pool.asked == []  # a whole existing cluster is not the allocator's question


def test_a_cluster_whose_job_has_no_time_limit_has_no_estimate() -> None:
    p, _ = decide([job("w", 2, cluster="c")], run=(running("r", 2, cluster="c"),))
    assert held(p) == [("w", Wait.CLUSTER, 1, None)]


def test_a_free_cluster_starts_only_the_first_of_two() -> None:
    run = (running("elsewhere", 2, ends_in=50, cluster="busy"),)
    p, pool = decide([job("w1", 2, at=1, dur=30, cluster="c"), job("w2", 2, at=2, cluster="c")],
                     run=run)
    assert p.starts == (Start("w1"),)
    assert held(p) == [("w2", Wait.CLUSTER, 1, 30.0)]
    assert pool.asked == []


def test_a_cluster_job_past_its_limit_is_estimated_now_not_in_the_past() -> None:
    p, _ = decide([job("w", 2, cluster="c")], run=(running("r", 2, ends_in=-5, cluster="c"),))
    assert held(p) == [("w", Wait.CLUSTER, 1, 0.0)]


def test_a_job_on_an_existing_cluster_frees_no_devices_when_it_ends() -> None:
    """The cluster keeps its 2 devices after its job: the head's 2 come only when r frees one
    at +200, so no device is spare and the small job without a time limit may not jump it."""
    run = (running("on-c", 2, ends_in=100, cluster="c"), running("r", 1, ends_in=200))
    p, pool = decide([job("head", count=2, at=1), job("small", at=2)], run=run, free=1)
    assert p.starts == ()
    assert held(p) == [("head", Wait.DEVICES, 1, 200.0), ("small", Wait.BEHIND, 2, None)]
    assert pool.free[A100] == 1
