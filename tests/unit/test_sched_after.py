"""Dependencies (`--after`, Slurm's afterok) and holds in the pure scheduler: a job waits for
the job it runs after to succeed and leaves the queue when that one cannot; a held job keeps its
place but never starts; neither holds up the jobs behind it. And why a job has no estimated
start, in words, from what really holds its devices."""

from __future__ import annotations

import pytest

from gpufleet.sched import after
from gpufleet.sched.model import Cancel, Limits, Plan, Resource, Running, Start, Wait, Waiting
from gpufleet.sched.plan import AHEAD_NO_LIMIT, CLUSTER_HOLDS, NO_END, NO_LIMIT, plan

NOW = 1_000_000.0
CPU: Resource = ("local", "cpu")


def job(name: str, count: int = 1, at: float = 0.0, dur: float | None = None,
        after_: str | None = None, held: bool = False, priority: int = 0,
        cluster: str | None = None) -> Waiting:
    return Waiting(name, "u", None, priority, at, CPU, count, cluster, dur, after=after_,
                   held=held)


def running(name: str, count: int = 1, ends_in: float | None = None, idle: bool = False,
            cluster: str | None = None) -> Running:
    return Running(name, "u", None, CPU, count, NOW - 10,
                   None if ends_in is None else NOW + ends_in, cluster, idle=idle)


def decide(waiting: list[Waiting], free: int = 0, run: tuple[Running, ...] = (),
           states: dict[str, str | None] | None = None) -> Plan:
    left = {CPU: free}

    def fits(w: Waiting) -> bool:
        if left[CPU] < w.count:
            return False
        left[CPU] -= w.count
        return True

    return plan(waiting, run, {CPU: free}, fits, Limits(), {}, NOW, states=states)


def waits(p: Plan) -> list[tuple[str, Wait, int, str | None]]:
    return [(h.name, h.wait, h.position, h.unknown) for h in p.held]


# the rule itself


@pytest.mark.parametrize("status, ready, never", [
    ("succeeded", True, False), ("running", False, False), ("queued", False, False),
    ("started", False, False), ("restarting", False, False), ("failed", False, True),
    ("stopped", False, True), ("interrupted", False, True), ("cancelled", False, True),
    ("refused", False, True), (None, False, True)])
def test_only_success_lets_a_dependent_start_and_only_an_end_without_it_dooms_it(
        status: str | None, ready: bool, never: bool) -> None:
    assert after.ready(status) is ready
    why = after.never("prep", status)
    assert (why is not None) is never
    if status is not None and never:
        assert why == (f"job prep, which it runs after, ended {status}; --after starts a job "
                       "only once that one succeeds")


def test_a_broken_chain_dooms_every_link_after_it_whatever_the_order() -> None:
    waiting = [job("c", after_="b"), job("b", after_="a"), job("x", after_="ok"), job("free")]
    doomed = after.doomed(waiting, {"a": "failed", "ok": "running"})
    assert doomed == {"b": after.never("a", "failed"),
                      "c": "job b, which it runs after, can never start (it leaves the queue too)"}


# in a pass


def test_a_job_after_a_running_one_waits_though_a_device_is_free_and_holds_up_no_one() -> None:
    p = decide([job("second", at=1, after_="first"), job("other", at=2)], free=1,
               run=(running("first", ends_in=100),), states={"first": "running"})
    assert p.starts == (Start("other"),)
    assert waits(p) == [("second", Wait.AFTER, 1, "after first")]
    assert p.held[0].text == "after first: starts once first succeeds (first is running)"
    assert p.held[0].est_start is None and p.cancels == ()


def test_a_job_after_one_that_succeeded_starts_in_its_turn() -> None:
    p = decide([job("second", after_="first")], free=1, states={"first": "succeeded"})
    assert p.starts == (Start("second"),) and p.held == ()


def test_a_job_after_one_still_queued_waits_for_it() -> None:
    p = decide([job("b", at=2, after_="a"), job("a", at=1, count=2)], free=1)
    assert p.starts == ()
    assert [(h.name, h.wait) for h in p.held] == [("a", Wait.DEVICES), ("b", Wait.AFTER)]
    assert p.held[1].text == "after a: starts once a succeeds (a is still queued)"


def test_jobs_after_a_failed_one_leave_the_queue_in_one_pass_and_take_no_place() -> None:
    p = decide([job("c", at=1, after_="b"), job("b", at=2, after_="a"), job("d", at=3)],
               free=0, states={"a": "failed"})
    assert p.cancels == (Cancel("c", "job b, which it runs after, can never start (it leaves "
                                "the queue too)"), Cancel("b", after.never("a", "failed")))
    assert waits(p) == [("d", Wait.DEVICES, 1, NO_END)]


def test_a_held_job_keeps_its_place_but_not_its_devices() -> None:
    waiting = [job("h", at=1, held=True), job("later", at=2)]
    p = decide(waiting, free=1)
    assert p.starts == (Start("later"),)
    assert waits(p) == [("h", Wait.HELD, 1, "held")]
    assert p.held[0].text == "held: it keeps its place but starts only after gpufleet release h"
    released = decide([job("h", at=1), job("later", at=2)], free=1)
    assert released.starts == (Start("h"),)  # back at its place, ahead of the later one


def test_a_held_job_whose_dependency_failed_still_leaves_the_queue() -> None:
    p = decide([job("h", held=True, after_="a")], states={"a": "stopped"})
    assert p.cancels == (Cancel("h", after.never("a", "stopped")),) and p.held == ()


# why there is no estimated start


def test_no_estimate_behind_a_running_job_without_a_time_limit() -> None:
    p = decide([job("head", at=1, dur=10), job("next", at=2, dur=10)],
               run=(running("r"),))
    assert waits(p) == [("head", Wait.DEVICES, 1, NO_LIMIT), ("next", Wait.BEHIND, 2, NO_LIMIT)]
    assert NO_LIMIT == "unknown (a running job has no --time-limit)"


def test_no_estimate_behind_a_job_ahead_without_a_time_limit() -> None:
    p = decide([job("head", count=2, at=1), job("two", count=2, at=2, dur=10)],
               run=(running("r", 2, ends_in=100),))
    assert waits(p) == [("head", Wait.DEVICES, 1, None), ("two", Wait.BEHIND, 2, AHEAD_NO_LIMIT)]


def test_no_estimate_where_a_launched_cluster_holds_the_devices() -> None:
    idle = decide([job("w")], run=(running("cluster dev", idle=True),))
    assert waits(idle) == [("w", Wait.DEVICES, 1, CLUSTER_HOLDS)]
    busy = decide([job("w")], run=(running("on-dev", ends_in=50, cluster="dev"),))
    assert waits(busy) == [("w", Wait.DEVICES, 1, CLUSTER_HOLDS)]


def test_no_estimate_after_a_job_started_in_this_pass_without_a_time_limit() -> None:
    p = decide([job("first", at=1), job("next", at=2)], free=1)
    assert p.starts == (Start("first"),)
    assert waits(p) == [("next", Wait.DEVICES, 1, NO_LIMIT)]


def test_no_estimate_on_a_cluster_whose_job_or_the_one_ahead_has_no_limit() -> None:
    p = decide([job("w1", 2, at=1, cluster="c"), job("w2", 2, at=2, cluster="c")],
               run=(running("r", 2, ends_in=50, cluster="c"),))
    assert [(h.name, h.est_start, h.unknown) for h in p.held] == [
        ("w1", NOW + 50, None), ("w2", None, AHEAD_NO_LIMIT)]
    p = decide([job("w", 2, cluster="c")], run=(running("r", 2, cluster="c"),))
    assert waits(p) == [("w", Wait.CLUSTER, 1, NO_LIMIT)]


def test_an_estimate_that_exists_has_no_unknown_note() -> None:
    p = decide([job("w", dur=10)], run=(running("r", ends_in=100),))
    assert [(h.est_start, h.unknown) for h in p.held] == [(NOW + 100, None)]
