"""Markers by folder, and how the integration tests may share the two cores.

Everything under tests/integration is `integration` (real processes, servers, a browser),
everything under tests/unit is `unit` (pure, fast), so a new file is marked by where it lives and
`pytest -m unit` is always the quick loop.

`scripts/check` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`), then the
`serial` tests alone. For that:
- every integration module is one xdist group, so its module fixtures (one GPT job, one
  reference run, one Ray pool's state) run once; `test_strategies` and `test_plan_measured` share
  one group because they read the same session-scoped launches (`strategy_runs.py`);
- the tests that judge a job's speed or utilization against thresholds (the diagnosis rules, an
  elastic job's scale-up and -down, the benchmark calibration) are `serial`: with another test on
  the same two cores their figures, not gpufleet, would decide the result.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent
_SHARED_GROUPS = {"test_strategies": "strategy_runs", "test_plan_measured": "strategy_runs"}
# module, or module::test name; why each is here is in the docstring above
_SERIAL = ("test_diagnosis_runs", "test_bench_calibration",
           "test_survive::test_elastic_job_scales_down_and_up_keeping_the_loss_curve")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.path)).relative_to(_HERE).parts[0]
        if folder in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, folder))
        if folder != "integration":
            continue
        module = Path(str(item.path)).stem
        item.add_marker(pytest.mark.xdist_group(_SHARED_GROUPS.get(module, module)))
        name = item.name.split("[")[0]
        if module in _SERIAL or f"{module}::{name}" in _SERIAL:
            item.add_marker(pytest.mark.serial)
