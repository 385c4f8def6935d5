"""The queue's order (gpufleet.sched.order): priority, then first come first served, with fair
share as a handicap on the submission time; and the decayed recent GPU-hours it is fed."""

from __future__ import annotations

import math

import pytest

from gpufleet.sched.model import Waiting
from gpufleet.sched.order import HALF_LIFE_S, WEIGHT_S_PER_GPU_HOUR, Use, ordered, recent_gpu_hours

NOW = 1_000_000.0
HOUR = 3600.0


def job(name: str, user: str = "u", priority: int = 0, at: float = 0.0) -> Waiting:
    return Waiting(name, user, None, priority, at, ("local", "a100"), 1)


def names(jobs: list[Waiting]) -> list[str]:
    return [w.name for w in jobs]


def test_priority_first_then_submission_time() -> None:
    waiting = [job("a", priority=0, at=1), job("b", priority=5, at=2), job("c", priority=0, at=3),
               job("d", priority=5, at=4), job("e", priority=1, at=5), job("f", priority=-1, at=0)]
    assert names(ordered(waiting, {})) == ["b", "d", "e", "a", "c", "f"]


def test_same_time_same_priority_is_ordered_by_name_whatever_the_input_order() -> None:
    assert names(ordered([job("z"), job("m"), job("a")], {})) == ["a", "m", "z"]


def test_light_user_goes_first_once_the_handicap_outweighs_the_gap() -> None:
    """A used 2 GPU-hours lately: a 2 h handicap by default. B's job, submitted an hour after
    A's, goes first; one submitted 3 h after does not."""
    usage = {"A": 2.0}
    a = job("a", "A", at=0.0)
    assert names(ordered([a, job("b", "B", at=HOUR)], usage)) == ["b", "a"]
    assert names(ordered([a, job("b", "B", at=3 * HOUR)], usage)) == ["a", "b"]


def test_equal_handicapped_times_fall_back_to_the_submission_time() -> None:
    usage = {"A": 2.0}
    assert names(ordered([job("b", "B", at=2 * HOUR), job("a", "A", at=0.0)], usage)) == ["a", "b"]
    # one second later and A's handicap no longer outweighs it
    assert names(ordered([job("b", "B", at=2 * HOUR - 1), job("a", "A")], usage)) == ["b", "a"]


def test_weight_scales_the_handicap() -> None:
    usage = {"A": 2.0}
    waiting = [job("a", "A", at=0.0), job("b", "B", at=HOUR)]
    assert names(ordered(waiting, usage, weight_s=0.0)) == ["a", "b"]  # fair share off
    assert names(ordered(waiting, usage, weight_s=HOUR / 4)) == ["a", "b"]  # 30 min < 1 h
    assert names(ordered(waiting, usage, weight_s=WEIGHT_S_PER_GPU_HOUR)) == ["b", "a"]


def test_one_users_jobs_keep_their_order_whatever_their_use() -> None:
    waiting = [job("a3", "A", at=30), job("b1", "B", at=15), job("a1", "A", at=10),
               job("a2", "A", at=20)]
    out = names(ordered(waiting, {"A": 50.0}))
    assert out == ["b1", "a1", "a2", "a3"]
    assert [n for n in names(ordered(waiting, {"B": 50.0})) if n.startswith("a")] == \
        ["a1", "a2", "a3"]


def test_priority_beats_fair_share() -> None:
    waiting = [job("b", "B", priority=0, at=0.0), job("a", "A", priority=1, at=HOUR)]
    assert names(ordered(waiting, {"A": 1000.0})) == ["a", "b"]


def test_a_user_with_no_recorded_use_has_no_handicap() -> None:
    waiting = [job("a", "A", at=10.0), job("b", "B", at=20.0)]
    assert names(ordered(waiting, {"C": 100.0})) == ["a", "b"]


# recent_gpu_hours


def test_one_device_for_one_hour_just_now_is_about_one_gpu_hour() -> None:
    got = recent_gpu_hours([Use("A", 1, NOW - HOUR, NOW)], NOW)
    k = math.log(2) / HALF_LIFE_S
    assert got == {"A": pytest.approx((1 - math.exp(-k * HOUR)) / k / HOUR)}
    assert 0.98 < got["A"] < 1.0  # a day's half-life barely touches the last hour


def test_the_decay_is_the_integral_over_the_interval() -> None:
    """With a one-hour half-life, the last hour weighs (1 - 1/2) / ln 2 GPU-hours."""
    got = recent_gpu_hours([Use("A", 1, NOW - HOUR, NOW)], NOW, half_life_s=HOUR)
    assert got["A"] == pytest.approx(0.5 / math.log(2))


def test_use_one_half_life_old_counts_half() -> None:
    fresh = recent_gpu_hours([Use("A", 1, NOW - 60, NOW)], NOW)["A"]
    old = recent_gpu_hours([Use("A", 1, NOW - HALF_LIFE_S - 60, NOW - HALF_LIFE_S)], NOW)["A"]
    assert old == pytest.approx(fresh / 2)
    older = recent_gpu_hours([Use("A", 1, NOW - 3 * HALF_LIFE_S - 60, NOW - 3 * HALF_LIFE_S)],
                             NOW)["A"]
    assert older == pytest.approx(fresh / 8)


def test_devices_multiply() -> None:
    one = recent_gpu_hours([Use("A", 1, NOW - 2 * HOUR, NOW - HOUR)], NOW)["A"]
    eight = recent_gpu_hours([Use("A", 8, NOW - 2 * HOUR, NOW - HOUR)], NOW)["A"]
    assert eight == pytest.approx(8 * one)


def test_a_running_use_counts_up_to_now_and_no_further() -> None:
    running = recent_gpu_hours([Use("A", 2, NOW - HOUR, None)], NOW)
    ended_now = recent_gpu_hours([Use("A", 2, NOW - HOUR, NOW)], NOW)
    ends_later = recent_gpu_hours([Use("A", 2, NOW - HOUR, NOW + 10 * HOUR)], NOW)
    assert running["A"] == pytest.approx(ended_now["A"])
    assert ends_later["A"] == pytest.approx(ended_now["A"])
    assert running["A"] == pytest.approx(2 * recent_gpu_hours([Use("A", 1, NOW - HOUR, NOW)],
                                                             NOW)["A"])


def test_uses_of_one_user_add_up_and_users_are_kept_apart() -> None:
    uses = [Use("A", 1, NOW - 2 * HOUR, NOW - HOUR), Use("A", 1, NOW - HOUR, NOW),
            Use("B", 1, NOW - 2 * HOUR, NOW)]
    got = recent_gpu_hours(uses, NOW)
    assert got["A"] == pytest.approx(got["B"])
    assert set(got) == {"A", "B"}


def test_empty_and_future_uses_count_nothing() -> None:
    uses = [Use("A", 4, NOW - 10, NOW - 10), Use("B", 4, NOW + 10, None),
            Use("C", 4, NOW + 10, NOW + 20)]
    assert recent_gpu_hours(uses, NOW) == {}


def test_decayed_use_feeds_the_order() -> None:
    """A ran 4 devices for 3 hours, ending just now; B ran the same a week ago. B's later job
    goes first today; a week later both have been forgiven and submission order wins."""
    uses = [Use("A", 4, NOW - 3 * HOUR, NOW), Use("B", 4, NOW - 7 * 24 * HOUR - 3 * HOUR,
                                                   NOW - 7 * 24 * HOUR)]
    today = recent_gpu_hours(uses, NOW)
    assert today["A"] > 11.0 and today["B"] < 0.1
    waiting = [job("a", "A", at=NOW), job("b", "B", at=NOW + HOUR)]
    assert names(ordered(waiting, today)) == ["b", "a"]
    later = NOW + 30 * 24 * HOUR
    assert names(ordered(waiting, recent_gpu_hours(uses, later))) == ["a", "b"]
