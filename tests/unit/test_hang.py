"""supervise.hang.find: is a job hung, and which rank is the likely cause."""

from __future__ import annotations

from gpufleet.supervise.hang import find

TIMEOUT = 60.0


def test_no_reports_and_no_startup_limit_is_never_a_hang() -> None:
    assert find(now=10_000.0, last_seen={}, started_at=0.0, timeout_s=TIMEOUT, stopped={},
                startup_s=None) is None


def test_no_reports_within_startup_is_not_a_hang() -> None:
    assert find(100.0, {}, 0.0, TIMEOUT, {}, startup_s=120.0) is None
    assert find(120.0, {}, 0.0, TIMEOUT, {}, startup_s=120.0) is None  # exactly at the limit


def test_no_reports_past_startup_is_a_hang_without_a_culprit() -> None:
    hang = find(120.5, {}, 0.0, TIMEOUT, {0: True}, startup_s=120.0)
    assert hang is not None
    assert hang.rank is None
    assert "no rank reported within 120 s of starting" in hang.description


def test_startup_counts_from_started_at() -> None:
    assert find(1_100.0, {}, 1_000.0, TIMEOUT, {}, startup_s=120.0) is None
    assert find(1_121.0, {}, 1_000.0, TIMEOUT, {}, startup_s=120.0) is not None


def test_a_recent_report_from_any_rank_is_not_a_hang() -> None:
    last_seen = {0: (90.0, 5), 1: (10.0, 2)}
    assert find(100.0, last_seen, 0.0, TIMEOUT, {1: True}) is None


def test_quiet_just_under_or_at_the_timeout_is_not_a_hang() -> None:
    last_seen = {0: (40.0, 5), 1: (30.0, 3)}
    assert find(99.9, last_seen, 0.0, TIMEOUT, {1: True}) is None
    assert find(100.0, last_seen, 0.0, TIMEOUT, {1: True}) is None


def test_reports_make_the_startup_limit_irrelevant() -> None:
    assert find(100.0, {0: (90.0, 1)}, 0.0, TIMEOUT, {}, startup_s=1.0) is None


def test_quiet_past_timeout_blames_a_stopped_rank() -> None:
    last_seen = {0: (30.0, 5), 1: (30.0, 5), 2: (30.0, 5)}
    hang = find(100.5, last_seen, 0.0, TIMEOUT, {0: False, 1: False, 2: True})
    assert hang is not None
    assert hang.rank == 2
    assert "stopped" in hang.description
    assert "rank 2 is stopped" in hang.description
    assert "no rank reported for 70 s (hang timeout 60 s)" in hang.description


def test_a_stopped_rank_wins_over_one_that_is_behind() -> None:
    last_seen = {0: (30.0, 5), 1: (30.0, 1), 2: (30.0, 5)}
    hang = find(100.0, last_seen, 0.0, TIMEOUT, {2: True})
    assert hang is not None
    assert hang.rank == 2
    assert "behind" not in hang.description


def test_several_stopped_ranks_name_all_and_blame_the_lowest() -> None:
    last_seen = {r: (0.0, 5) for r in range(4)}
    hang = find(100.0, last_seen, 0.0, TIMEOUT, {3: True, 1: True, 0: False})
    assert hang is not None
    assert hang.rank == 1
    assert "rank 1, 3 is stopped" in hang.description


def test_quiet_past_timeout_blames_the_rank_behind_in_steps() -> None:
    last_seen = {0: (30.0, 10), 1: (20.0, 7), 2: (35.0, 10)}
    hang = find(100.0, last_seen, 0.0, TIMEOUT, {0: False, 1: False, 2: False})
    assert hang is not None
    assert hang.rank == 1
    assert "behind" in hang.description
    assert "at step 7 while others reached 10" in hang.description


def test_the_lowest_of_several_ranks_behind_is_blamed() -> None:
    last_seen = {0: (0.0, 10), 1: (0.0, 7), 2: (0.0, 7)}
    hang = find(100.0, last_seen, 0.0, TIMEOUT, {})
    assert hang is not None
    assert hang.rank == 1


def test_all_ranks_at_the_same_step_has_no_culprit() -> None:
    last_seen = {0: (30.0, 10), 1: (20.0, 10)}
    hang = find(100.0, last_seen, 0.0, TIMEOUT, {0: False, 1: False})
    assert hang is not None
    assert hang.rank is None
    assert hang.description == "no rank reported for 70 s (hang timeout 60 s)"
