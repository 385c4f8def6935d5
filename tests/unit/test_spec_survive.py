"""spec: durations, worker ranges, and the JobSpec fields for surviving failures and scaling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import SpecError
from gpufleet.script_file import parse_job_here
from gpufleet.spec import MAX_GPUS_PER_JOB, JobSpec, parse_duration, parse_workers


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0), ("250ms", 0.25), (30, 30.0), (2.5, 2.5),
     ("45", 45.0), (" 2M ", 120.0), ("1H", 3600.0)],
)
def test_parse_duration(value: str | int | float, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["abc", "0s", "-1", 0, "5 minutes", "", "1w", "0ms"])
def test_parse_duration_refuses(value: str | int) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("value", "pair"),
    [("2:8", (2, 8)), ("4", (4, 4)), (4, (4, 4)), (" 1:1 ", (1, 1)),
     (f"1:{MAX_GPUS_PER_JOB}", (1, MAX_GPUS_PER_JOB))],
)
def test_parse_workers(value: str | int, pair: tuple[int, int]) -> None:
    assert parse_workers(value) == pair


@pytest.mark.parametrize("value", ["8:2", "0:2", "a:b", "1:200", "0", "2:", ":8", "1:2:3", -1])
def test_parse_workers_refuses(value: str | int) -> None:
    with pytest.raises(ValueError, match="worker range"):
        parse_workers(value)


# ---------------------------------------------------------------- JobSpec


@pytest.fixture
def base(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "x.py").write_text("print('hi')\n")
    return {"script": "x.py", "workdir": str(tmp_path)}


def problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Every problem of the job as `run` reports it (its script looked for on disk too)."""
    with pytest.raises(SpecError) as info:
        parse_job_here(data)
    return info.value.problems


def test_elastic_job_parses(base: dict[str, Any]) -> None:
    spec = JobSpec.parse({**base, "workers": "2:8", "scale_up_util": 0.8, "scale_down_util": 0.3,
                          "cooldown": "2m", "hang_timeout": "90s", "max_restarts": 3})
    assert spec.worker_range == (2, 8)
    assert spec.workers == "2:8"
    assert (spec.scale_up_util, spec.scale_down_util) == (0.8, 0.3)
    assert spec.cooldown_s == 120.0
    assert spec.hang_timeout_s == 90.0
    assert spec.max_restarts == 3


def test_defaults(base: dict[str, Any]) -> None:
    spec = JobSpec.parse(base)
    assert spec.worker_range is None
    assert spec.hang_timeout_s == 300.0
    assert spec.cooldown_s == 60.0
    assert spec.max_restarts == 0


def test_workers_as_a_number_is_a_fixed_range(base: dict[str, Any]) -> None:
    spec = JobSpec.parse({**base, "workers": 4})
    assert spec.workers == "4:4"
    assert spec.worker_range == (4, 4)


def test_script_is_found_relative_to_workdir(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text("")
    assert parse_job_here({"script": "sub/train.py", "workdir": str(tmp_path)}).script == "sub/train.py"
    with pytest.raises(SpecError) as info:
        parse_job_here({"script": "train.py", "workdir": str(tmp_path)})
    assert info.value.problems == [("script", "no such file: train.py")]


@pytest.mark.parametrize(("field", "value"), [("workers", "8:2"), ("workers", "a:b"),
                                              ("cooldown", "abc"), ("hang_timeout", "0s")])
def test_bad_values_name_their_field(base: dict[str, Any], field: str, value: str) -> None:
    found = problems({**base, field: value})
    assert [f for f, _ in found] == [field]
    assert ("worker range" if field == "workers" else "duration") in found[0][1]


def test_scale_down_must_be_below_scale_up(base: dict[str, Any]) -> None:
    for down in (0.8, 0.9):
        found = problems({**base, "workers": "2:8", "scale_up_util": 0.8, "scale_down_util": down})
        assert [f for f, _ in found] == ["scale_down_util"]
        assert "must be below scale_up_util (0.8)" in found[0][1]


def test_thresholds_are_not_cross_checked_without_workers(base: dict[str, Any]) -> None:
    spec = JobSpec.parse({**base, "scale_up_util": 0.5, "scale_down_util": 0.6})
    assert spec.worker_range is None


def test_util_bounds(base: dict[str, Any]) -> None:
    assert [f for f, _ in problems({**base, "scale_up_util": 0})] == ["scale_up_util"]
    assert [f for f, _ in problems({**base, "scale_up_util": 1.5})] == ["scale_up_util"]
    assert [f for f, _ in problems({**base, "scale_down_util": 1.0})] == ["scale_down_util"]


def test_scale_tolerance_is_a_share_below_one_and_reaches_the_policy(base: dict[str, Any]) -> None:
    from gpufleet.supervise.elastic import elastic_plan

    spec = JobSpec.parse({**base, "workers": "1:2"})
    assert spec.scale_tolerance == 0.1
    policy, _, _ = elastic_plan(JobSpec.parse({**base, "workers": "1:2", "scale_tolerance": 0}), 2)
    assert policy is not None and policy.tolerance == 0.0
    for bad in (1, 1.5, -0.1, float("nan")):
        found = problems({**base, "scale_tolerance": bad})
        assert [f for f, _ in found] == ["scale_tolerance"], bad
        assert f"got {float(bad)}; must be at least 0 and below 1" in found[0][1]


def test_elastic_needs_torchrun(base: dict[str, Any]) -> None:
    found = problems({**base, "workers": "2:4", "framework": "accelerate"})
    assert [f for f, _ in found] == ["workers"]
    assert "torchrun only, not accelerate" in found[0][1]


def test_workers_and_workers_per_node_are_exclusive(base: dict[str, Any]) -> None:
    found = problems({**base, "workers": "2:4", "workers_per_node": 2})
    assert [f for f, _ in found] == ["workers"]
    assert "not both" in found[0][1]


@pytest.mark.parametrize("extra", [{"strategy": "pp"}, {"pp": 2}])
def test_elastic_refuses_pipeline_parallelism(base: dict[str, Any], extra: dict[str, Any]) -> None:
    found = problems({**base, "workers": "2:4", **extra})
    assert [f for f, _ in found] == ["workers"]
    assert "pipeline" in found[0][1]


def test_every_elastic_problem_is_reported_together(tmp_path: Path) -> None:
    found = problems({"script": "x.py", "workdir": str(tmp_path), "workers": "2:4",
                      "framework": "accelerate", "workers_per_node": 2,
                      "scale_up_util": 0.5, "scale_down_util": 0.5})
    fields = [f for f, _ in found]
    assert fields.count("workers") == 2
    assert "script" in fields
    assert "scale_down_util" in fields


def test_yaml_worker_range_is_not_read_as_base_60(tmp_path: Path) -> None:
    """YAML 1.1 reads an unquoted 2:8 as the integer 128; a job file means the range."""
    from gpufleet.spec import load_yaml

    f = tmp_path / "job.yaml"
    f.write_text("script: x.py\nworkers: 2:8\nmax_restarts: 3\n")
    data = load_yaml(f)
    assert data["workers"] == "2:8" and data["max_restarts"] == 3
