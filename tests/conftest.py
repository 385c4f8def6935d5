"""Markers by folder, and how the integration tests may share the two cores.

Everything under tests/integration is `integration` (real processes, servers, a browser),
everything under tests/unit is `unit` (pure, fast), so a new file is marked by where it lives and
`pytest -m unit` is always the quick loop.

`scripts/check` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`), then the
`serial` tests alone. For that:
- every integration module is one xdist group, so its module fixtures (one GPT job, one
  reference run, one Ray pool's state) run once; `test_strategies` and `test_plan_measured` share
  one group because they read the same session-scoped launches (`strategy_runs.py`), and every
  module that imports `machines` (tests/integration/machines.py) is in the group `machines`: they
  share the three test machines, which one test may kill or cut while it runs;
- the tests that judge a job's speed or utilization against thresholds (the diagnosis runs for
  data loading, scaling and a healthy run; an elastic job's scale-up and -down; the benchmark
  calibration) are `serial`: with another test on the same two cores their figures, not
  gpufleet, would decide the result. A stall and a straggler are not among them: the stall's
  job waits at a gate until the test has seen it diagnosed, and the straggler is 5x its peers;
- the `machines` group is `serial` too: its modules run a Ray head and raylets, a Slurm and
  multi-machine jobs on the test machines, several processes' worth of CPU at once, which on
  two cores starved the other worker's tests (a queue server that did not answer in time, a
  hang taken for a stop); alone they cost the suite about their own run time.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

_HERE = Path(__file__).parent
_SHARED_GROUPS = {"test_strategies": "strategy_runs", "test_plan_measured": "strategy_runs"}
# module, module::test name or module::test[case]; why each is here is in the docstring above.
# Only the tests whose result a busy machine could change; the diagnosis runs that find an
# error (out of memory, a collective's timeout) or a non-finite loss, and the bench's refusals,
# run in the parallel pass.
_SERIAL = ("test_diagnosis_runs::test_a_healthy_run_has_no_warnings",
           "test_diagnosis_runs::test_poor_scaling_against_a_one_worker_run_of_the_same_script",
           "test_diagnosis_runs::test_a_provoked_problem_is_diagnosed[data]",
           "test_bench_calibration::test_benches_calibrate_the_planner",
           "test_survive::test_elastic_shrink_that_hurts_goodput_is_reverted_keeping_the_loss_curve")


# the helper itself, or ssh_pool_lab.py (an SSH pool of the machines), which imports it
_USES_MACHINES = re.compile(r"^\s*(from (machines|ssh_pool_lab) import|import (machines|ssh_pool_lab)\b)",
                            re.MULTILINE)


@functools.cache
def _uses_machines(path: str) -> bool:
    """Whether an integration module imports the test machines' helper (read once a module)."""
    try:
        return bool(_USES_MACHINES.search((_HERE.parent / path).read_text()))
    except OSError:
        return False


def group_of(nodeid: str) -> str:
    """The xdist group of a test: its integration module (or the group it shares), else its
    unit module."""
    path = nodeid.split("::", 1)[0]
    stem = Path(path).stem
    if Path(path).parts[:2] == ("tests", "integration"):
        if _uses_machines(path):
            return "machines"
        return _SHARED_GROUPS.get(stem, stem)
    return path


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadgroup`, by group name. pytest-xdist 3.8 tells groups apart by a suffix it
    writes into a test's private `_nodeid`, which pytest 9 no longer reads: every module's
    tests were spread over both workers (each paying for the module's fixtures, and the Slurm
    tests sharing one Slurm at once). This scheduler groups by `group_of(nodeid)` instead."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    # xdist would hand out the groups with the most tests first (a unit module of 200 quick
    # cases before a module of one 3-minute test); the collection order, longest first, is kept.
    config.option.loadscopereorder = False
    return ByGroup(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.path)).relative_to(_HERE).parts[0]
        if folder in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, folder))
        if folder != "integration":
            continue
        module = Path(str(item.path)).stem
        item.add_marker(pytest.mark.xdist_group(group_of(item.nodeid)))
        name = item.name.split("[")[0]
        if module in _SERIAL or f"{module}::{name}" in _SERIAL or f"{module}::{item.name}" in _SERIAL \
                or group_of(item.nodeid) == "machines":
            item.add_marker(pytest.mark.serial)
    # The longest groups first, so neither worker is left running one alone at the end (a
    # module picked up last, such as test_survive, kept one worker busy for minutes while the
    # other had nothing); a stable sort, so each module's own order stays.
    items.sort(key=_start_rank)


# The longest integration groups (seconds of one worker, measured on 2 cores), started first.
# `machines` (every module on the test machines) is placed by expectation: the SSH runs join it.
_LONGEST_FIRST = ("test_slurm_pool", "machines", "test_frameworks_cli", "test_jobs", "test_ray_pool",
                  "test_readme", "test_cli_parity", "strategy_runs", "test_survive",
                  "test_ordinary_scripts",
                  "test_cli_errors", "test_queue", "test_supervisor_kill", "test_error_records",
                  "test_ray_plain_scripts", "test_ordinary_progress", "test_team_server",
                  "test_checkpointer", "test_dashboard_api", "test_doctor", "test_state_guards",
                  "test_dashboard_browser", "test_clusters")


def _start_rank(item: pytest.Item) -> int:
    group = group_of(item.nodeid)
    return _LONGEST_FIRST.index(group) if group in _LONGEST_FIRST else len(_LONGEST_FIRST)
