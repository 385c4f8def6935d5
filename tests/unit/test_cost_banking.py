"""plan.cost.accrued_usd for clusters that changed size: banked dollars plus the current rate."""

from __future__ import annotations

import pytest

from gpufleet.plan.cost import accrued_usd

RATE = 3.6  # $/h: $0.001 a second, so the numbers below are easy to check by hand


def test_banked_plus_the_current_rate_since_the_change() -> None:
    # $1 banked at t=100; 100 s at $3.6/h since = $0.10
    assert accrued_usd(RATE, started_at=0.0, ended_at=None, now=200.0, banked_usd=1.0,
                       rate_since=100.0) == pytest.approx(1.1)


def test_banked_alone_at_the_moment_of_the_change() -> None:
    assert accrued_usd(RATE, 0.0, None, now=100.0, banked_usd=1.0, rate_since=100.0) == pytest.approx(1.0)


def test_the_current_rate_replaces_the_old_one_after_the_change() -> None:
    """Doubling the size at t=100 doubles what each later second costs."""
    before = accrued_usd(RATE, 0.0, None, now=100.0)
    assert before == pytest.approx(0.1)
    after = accrued_usd(2 * RATE, 0.0, None, now=200.0, banked_usd=before, rate_since=100.0)
    assert after == pytest.approx(0.1 + 0.2)


def test_ended_cluster_is_frozen() -> None:
    kwargs = {"started_at": 0.0, "ended_at": 150.0, "banked_usd": 1.0, "rate_since": 100.0}
    assert accrued_usd(RATE, now=150.0, **kwargs) == pytest.approx(1.05)
    assert accrued_usd(RATE, now=10_000.0, **kwargs) == pytest.approx(1.05)


def test_ended_before_the_rate_change_costs_only_the_banked() -> None:
    assert accrued_usd(RATE, 0.0, ended_at=50.0, now=500.0, banked_usd=2.0,
                       rate_since=100.0) == pytest.approx(2.0)


def test_rate_since_before_the_start_counts_from_the_start() -> None:
    assert accrued_usd(RATE, started_at=100.0, ended_at=None, now=300.0, banked_usd=0.0,
                       rate_since=0.0) == pytest.approx(0.2)


def test_never_started_costs_nothing_even_with_banked() -> None:
    assert accrued_usd(RATE, None, None, now=500.0, banked_usd=3.0, rate_since=100.0) == 0.0


@pytest.mark.parametrize(("ended_at", "now"), [(None, 500.0), (300.0, 500.0), (None, 50.0)])
def test_without_rate_since_it_is_the_plain_rate_since_start(ended_at: float | None, now: float) -> None:
    end = ended_at if ended_at is not None else now
    expected = RATE * max(0.0, end - 100.0) / 3600
    assert accrued_usd(RATE, 100.0, ended_at, now) == pytest.approx(expected)
    assert accrued_usd(RATE, 100.0, ended_at, now, rate_since=None) == pytest.approx(expected)


def test_rate_since_at_the_start_with_nothing_banked_equals_the_plain_rate() -> None:
    assert accrued_usd(RATE, 100.0, None, 500.0, banked_usd=0.0, rate_since=100.0) == \
        pytest.approx(accrued_usd(RATE, 100.0, None, 500.0))
