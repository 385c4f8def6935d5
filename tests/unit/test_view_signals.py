"""What the job view says besides its figures: that rank 0 has gone quiet (`no_report_s`, from the
record and `now` alone) and which charts this script does not produce (`measured`)."""

from __future__ import annotations

import json

import pytest

from gpufleet.store import Cluster, Job
from gpufleet.supervise import measured
from gpufleet.supervise.view import STALE_FLOOR_S, STALE_STEPS, job_view, no_report_s, quiet_limit_s

LAST = 2_000.0  # rank 0's newest report


def _spec(**fields: object) -> str:
    return json.dumps({"script": "train.py", "strategy": "ddp", "framework": "torchrun",
                       "tp": None, "pp": None, **fields})


def _job(**kw: object) -> Job:
    fields: dict[str, object] = dict(
        name="j", status="running", world_size=2, created_at=1_000.0, started_at=1_010.0,
        step=11, total_steps=100, first_step=1, first_step_at=1_900.0, last_report_at=LAST,
        samples=640, loss=1.0, first_loss=2.0, samples_per_s=5.0, reason=None, exit_code=None,
        spec_json=_spec(), layout_seen="applied")
    fields.update(kw)
    return Job(**fields)


def _cluster() -> Cluster:
    return Cluster(name="c", gpu="cpu", usd_per_hour=1.0, price_book="marketplace",
                   started_at=1_000.0, stopped_at=None, status="running")


def test_the_limit_is_several_step_times_but_never_under_the_floor() -> None:
    assert quiet_limit_s(None) == STALE_FLOOR_S
    assert quiet_limit_s(0.5) == STALE_FLOOR_S
    assert quiet_limit_s(10.0) == STALE_STEPS * 10.0 > STALE_FLOOR_S


def test_quiet_past_the_limit_says_for_how_long() -> None:
    job = _job()  # 10 steps in 100 s: 10 s a step, so the limit is 100 s
    assert no_report_s(job, LAST + 99.0) is None
    assert no_report_s(job, LAST + 130.0) == pytest.approx(130.0)
    fast = _job(first_step_at=LAST - 1.0)  # 0.1 s a step: the floor
    assert no_report_s(fast, LAST + STALE_FLOOR_S - 1) is None
    assert no_report_s(fast, LAST + 45.0) == pytest.approx(45.0)
    assert job_view(fast, _cluster(), LAST + 45.0).no_report_s == pytest.approx(45.0)


@pytest.mark.parametrize("status", ["starting", "restarting", "resizing", "succeeded", "failed"])
def test_only_a_running_job_is_called_quiet(status: str) -> None:
    assert no_report_s(_job(status=status), LAST + 1_000.0) is None


def test_a_run_that_has_not_reported_yet_is_starting_not_quiet() -> None:
    job = _job(first_step_at=LAST - 1.0)
    assert no_report_s(job, LAST + 500.0, run_started_at=LAST + 400.0) is None
    assert no_report_s(job, LAST + 500.0, run_started_at=LAST - 50.0) == pytest.approx(500.0)
    assert no_report_s(_job(last_report_at=None, step=None), LAST + 500.0) is None


def test_communication_is_not_measured_for_the_scripts_own_ddp_or_without_prepare() -> None:
    own = measured.not_measured(_spec(), 2, "own:ddp", 5, 1, 80)
    assert set(own) == set(measured.COMM)
    assert own["comm_seconds"].startswith("the script runs as written (the script's own DDP)")
    assert "ddp and zero1" in own["comm_seconds"]
    assert measured.not_measured(_spec(), 2, None, 5, 1, 80)["comm_seconds"] == \
        measured.NO_PREPARE
    assert measured.not_measured(_spec(), 2, None, None, None, 0) == {}  # no report yet


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, None), ({"strategy": "zero1"}, None),
    ({"strategy": "fsdp"}, measured.NO_HOOK), ({"strategy": "zero3"}, measured.NO_HOOK),
    ({"strategy": "tp", "tp": 2}, measured.NO_HOOK), ({"strategy": "ddp", "pp": 2}, measured.NO_HOOK),
    ({"framework": "deepspeed", "strategy": "zero2"}, measured.DEEPSPEED),
])
def test_an_applied_layout_is_measured_only_under_ddps_hook(fields: dict[str, object],
                                                            expected: str | None) -> None:
    got = measured.not_measured(_spec(**fields), 4, "applied", 5, 1, 80)
    assert got.get("comm_seconds") == expected
    assert got.get("comm_bandwidth_bytes_per_second") == expected


def test_one_worker_has_no_all_reduce_to_time() -> None:
    got = measured.not_measured(_spec(), 1, "applied", 5, 1, 80)
    assert got["comm_seconds"] == measured.ONE_WORKER


def test_throughput_is_not_measured_once_two_reports_came_without_samples() -> None:
    assert "job_samples_per_second" not in measured.not_measured(_spec(), 2, "applied", 1, 1, 0)
    got = measured.not_measured(_spec(), 2, "applied", 2, 1, 0)
    assert got["job_samples_per_second"] == measured.NO_SAMPLES
    assert "job_samples_per_second" not in measured.not_measured(_spec(), 2, "applied", 2, 1, 64)
    view = job_view(_job(samples=0, layout_seen="own:none"), _cluster(), LAST)
    assert set(view.not_measured) == {*measured.COMM, "job_samples_per_second"}
