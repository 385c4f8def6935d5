"""supervise.elastic: the world sizes an elastic job may take and when it moves between them."""

from __future__ import annotations

import pytest

from gpufleet.supervise.elastic import Policy, decide, grad_accum, mean_utilization, sizes
from gpufleet.supervise.goodput import Holds

NOW = 1_000.0
POLICY = Policy(min_workers=2, max_workers=8, scale_up_util=0.9, scale_down_util=0.5, cooldown_s=60.0)
ALLOWED = [2, 4, 8]


def samples(value: float, start: float = NOW - 35, end: float = NOW) -> list[tuple[float, float]]:
    """One utilization sample a second from `start` to `end`."""
    n = int(end - start)
    return [(start + i, value) for i in range(n + 1)]


def run(util: list[tuple[float, float]], workers: int = 4, free: int = 8,
        allowed: list[int] | None = None, since: float = NOW - 120, policy: Policy = POLICY,
        holds: Holds = Holds(), ran_at: int = 0):
    return decide(policy, ALLOWED if allowed is None else allowed, workers, util, NOW, since, free,
                  holds, ran_at)


# ---------------------------------------------------------------- sizes / grad_accum


def test_sizes_are_divisors_of_the_maximum_in_range() -> None:
    assert sizes(POLICY) == [2, 4, 8]
    assert sizes(Policy(1, 12, 0.9, 0.5, 60)) == [1, 2, 3, 4, 6, 12]
    assert sizes(Policy(3, 8, 0.9, 0.5, 60)) == [4, 8]
    assert sizes(Policy(4, 4, 0.9, 0.5, 60)) == [4]


def test_sizes_skip_those_the_layout_rejects() -> None:
    assert sizes(POLICY, fits=lambda w: w != 4) == [2, 8]
    assert sizes(POLICY, fits=lambda w: False) == []


def test_grad_accum_keeps_the_global_batch() -> None:
    assert [grad_accum(POLICY, w) for w in sizes(POLICY)] == [4, 2, 1]


def test_window_is_the_cooldown_at_most_thirty_seconds() -> None:
    assert POLICY.window_s == 30.0
    assert Policy(2, 8, 0.9, 0.5, 10.0).window_s == 10.0


# ---------------------------------------------------------------- decide: waiting


def test_cooling_down_after_a_change() -> None:
    d = run(samples(1.0), since=NOW - 59.0)
    assert (d.workers, d.reason) == (4, "cooling down")


def test_cooldown_just_over() -> None:
    assert run(samples(1.0), since=NOW - 60.0).workers == 8


def test_no_samples_is_not_enough_history() -> None:
    d = run([])
    assert (d.workers, d.reason) == (4, "not enough utilization history yet")


def test_samples_not_covering_the_window_are_not_enough_history() -> None:
    d = run(samples(1.0, start=NOW - 20))
    assert d.workers == 4
    assert "not enough utilization history" in d.reason


def test_history_must_reach_the_window_start_within_a_second() -> None:
    assert run(samples(1.0, start=NOW - 29.0)).workers == 8  # 1 s short: accepted
    assert "not enough" in run(samples(1.0, start=NOW - 28.5)).reason


def test_only_old_samples_are_not_enough_history() -> None:
    d = run(samples(1.0, start=NOW - 100, end=NOW - 40))
    assert d.workers == 4
    assert "not enough utilization history" in d.reason


# ---------------------------------------------------------------- decide: moving


def test_scale_up_to_the_next_allowed_size() -> None:
    d = run(samples(0.95), workers=2, free=6)
    assert d.workers == 4
    assert "0.95 >= 0.90" in d.reason


def test_scale_up_at_exactly_the_threshold() -> None:
    util = [(NOW - 30, 0.9), (NOW, 0.9)]  # two samples: the mean is exactly 0.9 in floats
    assert run(util, workers=2, free=2).workers == 4


def test_scale_up_skips_sizes_the_layout_rejects() -> None:
    assert run(samples(0.95), workers=2, free=6, allowed=[2, 8]).workers == 8


def test_scale_up_blocked_by_too_few_free_devices() -> None:
    d = run(samples(0.95), workers=2, free=1)
    assert d.workers == 2
    assert "1 free device(s)" in d.reason
    assert "growing to 4 needs 2" in d.reason


def test_scale_up_blocked_when_the_next_allowed_size_needs_more_than_free() -> None:
    d = run(samples(0.95), workers=2, free=5, allowed=[2, 8])
    assert d.workers == 2
    assert "5 free device(s)" in d.reason
    assert "growing to 8 needs 6" in d.reason


def test_scale_down_to_the_next_smaller_size() -> None:
    d = run(samples(0.3), workers=8, free=0)
    assert d.workers == 4
    assert "0.30 <= 0.50" in d.reason


def test_scale_down_at_exactly_the_threshold() -> None:
    assert run([(NOW - 30, 0.5), (NOW, 0.5)], workers=4).workers == 2


def test_between_thresholds_stays() -> None:
    d = run(samples(0.7), workers=4)
    assert d.workers == 4
    assert "within thresholds" in d.reason


def test_only_the_window_counts_towards_the_mean() -> None:
    """Busy samples before the window do not push a half-idle job up."""
    util = samples(1.0, start=NOW - 200, end=NOW - 31) + samples(0.7, start=NOW - 30)
    assert run(util, workers=4).workers == 4


def test_mean_over_the_window() -> None:
    util = [(NOW - 30 + i, 1.0 if i % 2 else 0.85) for i in range(31)]  # mean above 0.9
    assert run(util, workers=2, free=2).workers == 4


def test_at_min_size_no_scale_down() -> None:
    assert run(samples(0.0), workers=2).workers == 2


def test_at_max_size_no_scale_up() -> None:
    assert run(samples(1.0), workers=8, free=100).workers == 8


def test_mean_utilization_averages_devices_per_second_since_training_began() -> None:
    by_device = {"cpu0": [(9.0, 0.1), (10.2, 0.8), (11.0, 0.6)], "cpu1": [(10.4, 0.4), (11.1, 1.0)]}
    assert mean_utilization(by_device, since=10.0) == ((10, pytest.approx(0.6)), (11, 0.8))
    assert mean_utilization({}, since=0.0) == ()


# ---------------------------------------------------------------- decide: holds and growing back


def test_a_held_off_shrink_stays_and_says_for_how_long() -> None:
    d = run(samples(0.3), workers=8, free=0, holds=Holds(shrink_until=NOW + 200.0))
    assert d.workers == 8
    assert d.reason == "utilization 0.30 <= 0.50 over 30 s, but shrinking is on hold for 200 s more"


def test_a_held_off_grow_stays_even_with_free_devices() -> None:
    d = run(samples(0.95), workers=2, free=6, holds=Holds(grow_until=NOW + 1.0))
    assert d.workers == 2 and "growing is on hold for 1 s more" in d.reason


def test_grows_back_toward_the_size_it_ran_at_whatever_the_utilization() -> None:
    d = run(samples(0.3), workers=2, free=6, ran_at=8, allowed=[2, 4, 8])
    assert (d.workers, d.reason) == (4, "growing back toward 8, the size it ran at before")
    assert run(samples(0.7), workers=2, free=6, ran_at=4).workers == 4


def test_grows_back_no_further_than_the_size_it_ran_at() -> None:
    assert run(samples(0.7), workers=4, free=6, ran_at=4).workers == 4
    assert run(samples(0.7), workers=2, free=0, ran_at=0).workers == 2


def test_no_growing_back_without_free_devices_or_during_a_hold() -> None:
    d = run(samples(0.7), workers=2, free=1, ran_at=4)
    assert d.workers == 2 and "the pool has 1 free device(s) and growing to 4 needs 2" in d.reason
    d = run(samples(0.7), workers=2, free=6, ran_at=4, holds=Holds(grow_until=NOW + 5))
    assert d.workers == 2 and "on hold" in d.reason


def test_a_low_utilization_shrink_comes_before_growing_back() -> None:
    assert run(samples(0.3), workers=4, free=6, ran_at=8).workers == 2
