"""Fixtures of the integration tests: a `Fleet` (the CLI bound to its own state folder) per test,
cleaned up afterwards: every cluster stopped, and the test fails if any process it started is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import Fleet
from strategy_runs import DEEPSPEED, FOUR, FOUR_PLANNED, OWN_DEEPSPEED, TWO, results


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path / "home", tmp_path / "cwd", slots=2)
    yield f
    left = f.cleanup()
    assert not left, f"processes left behind by the test: {left}"


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[Callable[[str, int], Fleet]]:
    """Several fleets (homes) in one test, all cleaned up at the end."""
    made: list[Fleet] = []

    def make(name: str, slots: int) -> Fleet:
        f = Fleet(tmp_path / name / "home", tmp_path / name / "cwd", slots=slots)
        made.append(f)
        return f

    yield make
    left = [line for f in made for line in f.cleanup()]
    assert not left, f"processes left behind by the test: {left}"


@pytest.fixture(scope="session")
def two_ranks() -> dict[str, dict[str, Any]]:
    """Every 2-rank layout of test_strategies.py and test_plan_measured.py, in one launch."""
    return results(2, TWO + DEEPSPEED + [OWN_DEEPSPEED])


@pytest.fixture(scope="session")
def four_ranks() -> dict[str, dict[str, Any]]:
    """Every 4-rank layout of test_strategies.py and test_plan_measured.py, in one launch."""
    return results(4, FOUR + FOUR_PLANNED)
