"""supervise.goodput: a resize judged by what it did to samples/s and samples per dollar, on
recorded series (the figures of issue 27's trials among them)."""

from __future__ import annotations

import itertools

import pytest

from gpufleet.supervise.goodput import (
    Direction,
    Goodput,
    Holds,
    Judgement,
    Mark,
    Trial,
    Verdict,
    judge,
    measure,
)

RATE = 0.0446  # $/device-hour of a CPU slot in the hyperscaler book, as the trial was billed
BATCH = 160  # examples/gpt.py's global batch on the README's line: samples per step
NOW = 10_000.0


def series(rates: list[float], start: float, per_step: int = BATCH,
           step0: int = 0) -> tuple[Mark, ...]:
    """Rank 0's reports of steps whose samples/s are `rates`, one step each, from `start`."""
    marks, t, step = [Mark(start, step0, 0)], start, step0
    for i, r in enumerate(rates, start=1):
        t += per_step / r
        step += 1
        marks.append(Mark(t, step, i * per_step))
    return tuple(marks)


def steady(rate: float, seconds: float) -> list[float]:
    """`seconds` of steps at `rate` samples/s."""
    return [rate] * int(seconds * rate / BATCH)


def verdict(before: tuple[Mark, ...], after: tuple[Mark, ...], workers: tuple[int, int],
            tolerance: float = 0.1, holds: Holds = Holds()) -> tuple[Judgement, Holds]:
    """The verdict on a resize between the sizes `workers`, from the last 15 s before it and
    the whole `after` series."""
    b = measure(before, workers[0], RATE, before[-1].t - 15.0, before[-1].t)
    a = measure(after, workers[1], RATE, after[0].t, after[-1].t)
    assert b is not None and a is not None
    return judge(Trial(b, workers[1], "utilization 0.42 <= 0.50 over 15 s"), a, tolerance,
                 holds, 15.0, NOW)


# ---------------------------------------------------------------- issue 27's trials


def test_the_trials_shrink_413_to_18_78_samples_per_s_is_reverted_to_2() -> None:
    before = series(steady(413.0, 20), 0.0)
    after = series(list(itertools.islice(itertools.cycle([18.0, 78.0, 41.0, 55.0, 30.0]), 12)),
                   100.0)
    j, holds = verdict(before, after, (2, 1))
    assert j.verdict is Verdict.REVERTED
    assert j.speed_change < -0.8 and j.per_usd_change < -0.6
    assert j.held is Direction.SHRINK and holds.shrink_until == NOW + 300.0
    assert j.text.endswith("; reverted to 2; no shrinking for 5m")


def test_the_second_runs_shrink_470_to_70_120_samples_per_s_is_reverted_too() -> None:
    before = series(steady(470.0, 20), 0.0)
    after = series([70.0, 120.0, 95.0, 80.0, 110.0, 70.0, 120.0, 100.0], 100.0)
    j, _ = verdict(before, after, (2, 1))
    assert j.verdict is Verdict.REVERTED and -0.85 < j.speed_change < -0.75


def test_this_repro_on_a_host_with_two_cpu_burners_146_to_20_27_is_reverted() -> None:
    """The README's line with --cooldown 15s next to two busy loops, before the fix:
    145.9 samples/s on 2 workers, 20.1-26.9 after the shrink to 1."""
    before = series(steady(145.9, 20), 0.0)
    after = series([23.8, 26.9, 20.1, 26.3, 22.0], 100.0)
    j, _ = verdict(before, after, (2, 1))
    assert j.verdict is Verdict.REVERTED and j.per_usd_change < -0.6


def test_the_revert_event_says_it_with_the_figures() -> None:
    before = series(steady(413.0, 20), 0.0)
    after = series(steady(74.0, 20), 100.0)
    j, _ = verdict(before, after, (2, 1))
    assert j.text == ("throughput fell 82% after 2 -> 1 (413 -> 74.0 samples/s; samples per $ "
                      "16.7M -> 5.97M, -64%, more than the 10% tolerance); reverted to 2; no "
                      "shrinking for 5m")
    assert j.summary == "throughput fell 82%, samples per $ -64%"


# ---------------------------------------------------------------- kept


def test_a_shrink_that_keeps_most_of_the_speed_is_kept() -> None:
    before = series(steady(400.0, 20), 0.0)
    after = series(steady(380.0, 20), 100.0)
    j, holds = verdict(before, after, (2, 1))
    assert j.verdict is Verdict.KEPT and j.per_usd_change == pytest.approx(0.9)
    assert "+90%); kept 1; no growing for 5m" in j.text
    assert holds.grow_until == NOW + 300.0 and holds.shrink_until == 0.0  # the way back waits


def test_a_grow_that_pays_for_itself_is_kept() -> None:
    before = series(steady(74.0, 30), 0.0)
    after = series(steady(413.0, 20), 100.0)
    j, holds = verdict(before, after, (1, 2))
    assert j.verdict is Verdict.KEPT and j.speed_change > 4
    assert holds.shrink_until == NOW + 300.0


def test_a_noisy_but_flat_series_is_kept_within_the_tolerance() -> None:
    """Per-step rates +-20% around the same samples per worker on both sizes."""
    noise = [1.0, 0.8, 1.2, 0.9, 1.1, 0.85, 1.15, 1.0]
    before = series([400.0 * n for n in noise * 4], 0.0)
    after = series([200.0 * n for n in reversed(noise * 3)], 100.0)
    j, _ = verdict(before, after, (2, 1))
    assert j.verdict is Verdict.KEPT and abs(j.per_usd_change) < 0.1
    assert "within the 10% tolerance" in j.text or j.per_usd_change >= 0


@pytest.mark.parametrize(("kept_share", "expected"), [(0.46, Verdict.KEPT),
                                                      (0.44, Verdict.REVERTED)])
def test_the_tolerance_is_the_line(kept_share: float, expected: Verdict) -> None:
    """2 -> 1 keeping 46% of the speed is -8% per $, 44% is -12%: one side of 10% each."""
    before = series(steady(400.0, 20), 0.0)
    after = series(steady(400.0 * kept_share, 20), 100.0)
    assert verdict(before, after, (2, 1))[0].verdict is expected
    assert verdict(before, after, (2, 1), tolerance=0.2)[0].verdict is Verdict.KEPT


# ---------------------------------------------------------------- hold-offs


def test_each_revert_in_a_row_doubles_the_hold_off_up_to_eight_times() -> None:
    before = series(steady(413.0, 20), 0.0)
    after = series(steady(74.0, 20), 100.0)
    holds, waits = Holds(), []
    for _ in range(5):
        j, holds = verdict(before, after, (2, 1), holds=holds)
        waits.append(j.hold_s)
    assert waits == [300.0, 600.0, 1200.0, 2400.0, 2400.0]
    assert j.text.endswith("no shrinking for 40m")
    j, holds = verdict(before, series(steady(400.0, 20), 100.0), (2, 1), holds=holds)
    assert j.verdict is Verdict.KEPT and holds.shrink_reverts == 0  # a kept one starts afresh


def test_the_hold_off_is_ten_cooldowns_when_that_is_longer() -> None:
    b = Goodput(2, 2.0, 320.0, 2 * RATE)
    a = Goodput(1, 0.2, 32.0, RATE)
    j, holds = judge(Trial(b, 1, "x"), a, 0.1, Holds(), 60.0, NOW)
    assert j.hold_s == 600.0 and holds.shrink_until == NOW + 600.0


# ---------------------------------------------------------------- measuring


def test_a_window_needs_three_steps() -> None:
    marks = series([100.0, 100.0], 0.0)
    assert measure(marks, 1, RATE, 0.0, 10.0) is None
    assert measure(series([100.0] * 3, 0.0), 1, RATE, 0.0, 10.0) is not None


def test_slow_steps_reach_back_before_the_window() -> None:
    marks = series([16.0] * 6, 0.0)  # 10 s a step
    assert measure(marks, 1, RATE, 45.0, 60.0) is None
    got = measure(marks, 1, RATE, 45.0, 60.0, reach_back=True)
    assert got is not None and got.samples_per_s == pytest.approx(16.0)


def test_a_window_that_counted_no_samples_is_judged_by_its_steps() -> None:
    zero = tuple(Mark(m.t, m.step, 0) for m in series(steady(400.0, 20), 0.0))
    got = measure(zero, 2, RATE, 0.0, 20.0)
    assert got is not None and got.samples_per_s is None and got.steps_per_s == pytest.approx(2.5)


def test_without_samples_it_judges_steps_per_second() -> None:
    """An elastic job's global batch is fixed, so steps/s is its goodput too."""
    plain = tuple(Mark(m.t, m.step, None) for m in series(steady(400.0, 20), 0.0))
    b = measure(plain, 2, 0.0, 0.0, 20.0)
    a = measure(tuple(Mark(m.t, m.step, None) for m in series(steady(100.0, 20), 50.0)),
                1, 0.0, 50.0, 70.0)
    assert b is not None and a is not None and b.samples_per_s is None
    j, _ = judge(Trial(b, 1, "x"), a, 0.1, Holds(), 3.0, NOW)
    assert j.unit == "steps/s" and j.verdict is Verdict.REVERTED
    assert "(2.50 -> 0.63 steps/s; per worker -50%" in j.text  # no price: per worker
