"""What `lifecycle.submit` refuses before anything starts, decided by the pool's capabilities
(not its name), and how many workers a job starts with."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import SpecError
from gpufleet.lifecycle.submit import check_pool_job, first_world
from gpufleet.spec import JobSpec

HERE = Path(__file__).resolve()


def _spec(**extra: object) -> JobSpec:
    return JobSpec.parse({"script": HERE.name, "workdir": str(HERE.parent), "cluster": "c",
                          **extra})


def test_a_simulated_pool_runs_no_job() -> None:
    with pytest.raises(SpecError, match="simulated pool only plans"):
        check_pool_job(_spec(), "sim", 1)


def test_off_this_host_only_multi_node_frameworks_and_no_elastic() -> None:
    check_pool_job(_spec(framework="deepspeed"), "ray", 2)
    with pytest.raises(SpecError, match="runs on this host's pool only"):
        check_pool_job(_spec(framework="accelerate"), "ray", 1)
    with pytest.raises(SpecError, match="elastic resizing runs on the local pool only"):
        check_pool_job(_spec(workers="1:2"), "ray", 1)


def test_this_host_takes_any_framework_and_elastic_jobs() -> None:
    check_pool_job(_spec(framework="accelerate"), "local", 1)
    check_pool_job(_spec(workers="1:2"), None, 1)


def test_first_world_is_one_worker_per_device_unless_told() -> None:
    assert first_world(_spec(), 4, "c") == 4
    assert first_world(_spec(workers_per_node=2), 8, "c", nodes=2) == 4
