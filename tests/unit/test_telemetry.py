"""Pure parts of telemetry: the schema, in-worker counters, downsampling tiers, the recent
window, projected cost, dashboard access rules."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gpufleet.plan import cost
from gpufleet.store import retention
from gpufleet.supervise.supervisor import _opt
from gpufleet.supervise.telemetry import threads_of, thresholds_from_env
from gpufleet.telemetry import schema
from gpufleet.telemetry.diagnose import Thresholds
from gpufleet.telemetry.recent import Recent
from gpufleet.train.telemetry import Counters
from gpufleet.web import auth

# --- schema ---------------------------------------------------------------------------------


def test_every_name_carries_a_unit_suffix_or_is_dimensionless() -> None:
    units = ("_seconds", "_bytes", "_usd", "_watts", "_celsius", "_per_second", "_per_hour")
    dimensionless = {"gpu_utilization", "loss", "loss_scale", "skipped_steps", "job_step",
                     "job_loss", "job_running", "job_findings", "cluster_devices"}
    for name in schema.METRICS:
        assert name.endswith(units) or name in dimensionless, name


def test_the_issue_names_exist_with_the_prometheus_prefix() -> None:
    for name in ("gpu_utilization", "job_samples_per_second", "job_cost_usd"):
        assert name in schema.METRICS
    assert schema.prometheus_name("gpu_utilization") == "gpufleet_gpu_utilization"


def test_scopes_split_devices_from_ranks_and_unknown_names_are_a_ranks() -> None:
    assert "gpu_memory_used_bytes" in schema.DEVICE_METRICS
    assert "comm_seconds" in schema.RANK_METRICS
    assert schema.scope_of("job_cost_usd") == "job"
    assert schema.scope_of("my_custom_metric") == "rank"


# --- in-worker counters ----------------------------------------------------------------------


def test_overlapping_buckets_count_wall_time_once() -> None:
    c = Counters()
    c.comm_done(10.0, 10.4, 100)  # two buckets in flight together: 10.0-10.4 and 10.2-10.5
    c.comm_done(10.2, 10.5, 100)
    c.comm_done(11.0, 11.1, 50)  # a later one, alone
    assert c.comm_s == pytest.approx(0.6)
    assert c.comm_bytes == 250


def test_take_divides_by_the_steps_since_the_last_report() -> None:
    c = Counters()
    c.take(10)  # the first report only marks the time
    c.data_wait_s, c.comm_world = 0.8, 4
    c.comm_done(0.0, 0.4, 1000)
    out = c.take(14)
    assert out["data_wait_seconds"] == pytest.approx(0.2)
    assert out["comm_seconds"] == pytest.approx(0.1)
    assert out["comm_bytes"] == pytest.approx(250)
    # ring all-reduce moves 2(n-1)/n of the buffer: 1000 B x 1.5 over 0.4 s
    assert out["comm_bandwidth_bytes_per_second"] == pytest.approx(3750)
    assert out["step_time_seconds"] > 0
    assert c.data_wait_s == 0 and c.comm_bytes == 0  # a new interval starts


def test_take_without_communication_reports_no_comm_figures() -> None:
    c = Counters()
    c.take(1)
    out = c.take(2)
    assert "comm_seconds" not in out and "step_time_seconds" in out


def test_fp16_figures_ride_along() -> None:
    c = Counters()
    c.skipped_steps, c.loss_scale = 3, 1024.0
    assert c.take(1) == {"skipped_steps": 3.0, "loss_scale": 1024.0}


# --- downsampling ----------------------------------------------------------------------------


def test_cuts_fall_on_bucket_edges() -> None:
    for cut, bucket in retention.cuts(1_000_007.3):
        assert cut % bucket == 0
    (cut10, b10), (cut60, b60), _ = retention.cuts(10_000.0)
    assert (b10, b60) == (10.0, 60.0)
    assert cut10 == 9_400.0  # 10,000 - 600 s, already on a 10 s edge
    assert cut60 == 0.0  # 10,000 - 6 h is negative: nothing that old


def test_a_week_at_one_hertz_keeps_a_few_thousand_rows() -> None:
    week = 7 * 86400.0
    bound = retention.rows_bound(week)
    # 60 s not yet compacted + 600 raw + (6 h - 10 min) / 10 s + 18 h / 60 s + 6 days / 10 min
    assert bound == pytest.approx(60 + 600 + 2100 + 1080 + 864, abs=10)
    assert bound < week / 100


# --- the recent window -----------------------------------------------------------------------


def test_recent_keeps_only_the_span() -> None:
    r = Recent(span_s=10.0)
    for t in range(30):
        r.add("step_time_seconds", 0, float(t), t * 0.1)
    snap = r.snapshot(29.0)
    assert [t for t, _ in snap["step_time_seconds"][0]] == [float(t) for t in range(19, 30)]


# --- thresholds from the environment ---------------------------------------------------------


def test_stall_threshold_from_the_environment() -> None:
    assert thresholds_from_env({"GPUFLEET_STALL_AFTER_S": "30"}).stall_min_s == 30.0
    assert thresholds_from_env({"GPUFLEET_STALL_AFTER_S": "soon"}) == Thresholds()
    assert thresholds_from_env({}) == Thresholds()


# --- money -----------------------------------------------------------------------------------


def test_projected_cost_is_so_far_plus_the_rate_over_the_eta() -> None:
    assert cost.projected_usd(1.5, 36.0, 600.0) == pytest.approx(1.5 + 6.0)
    assert cost.projected_usd(1.5, 36.0, None) is None


# --- dashboard access ------------------------------------------------------------------------


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.0.0.2", True),
                                       ("::1", True), ("localhost", True),
                                       ("0.0.0.0", False), ("10.1.2.3", False),
                                       ("myhost.example", False)])
def test_only_loopback_goes_without_a_token(host: str, loop: bool) -> None:
    assert auth.is_loopback(host) is loop


def test_token_is_made_once_and_owner_only(tmp_path: Path) -> None:
    first = auth.token(tmp_path)
    assert len(first) >= 40 and auth.token(tmp_path) == first
    mode = stat.S_IMODE((tmp_path / auth.TOKEN_FILE).stat().st_mode)
    assert mode == 0o600


def test_token_sources_and_comparison() -> None:
    assert auth.presented("Bearer abc", None, None) == "abc"
    assert auth.presented(None, "cookie", "query") == "query"
    assert auth.presented(None, "cookie", None) == "cookie"
    assert auth.allowed(None, None)  # loopback: no token needed
    assert not auth.allowed("secret", None)
    assert not auth.allowed("secret", "secreT")
    assert auth.allowed("secret", "secret")


@pytest.mark.parametrize("host,ok", [("127.0.0.1:8470", True), ("localhost:8470", True),
                                     ("[::1]:8470", True), ("LOCALHOST", True),
                                     ("evil.example:8470", False), ("127.0.0.1.evil.example", False),
                                     (None, False), ("127.0.0.2:8470", True)])
def test_a_tokenless_dashboard_answers_loopback_names_only(host: str | None, ok: bool) -> None:
    assert auth.host_allowed(host, bound="127.0.0.2") is ok


@pytest.mark.parametrize("value,threads", [("4", 4), ("4,2", 4), ("", 1), ("auto", 1), ("0", 1)])
def test_threads_per_worker_from_omp_num_threads(value: str, threads: int) -> None:
    assert threads_of({"OMP_NUM_THREADS": value}) == threads


def test_report_fields_must_be_numbers() -> None:
    """The report port is open to any local process: a string must not reach the store."""
    assert _opt(int, 12.0) == 12 and _opt(float, 3) == 3.0 and _opt(int, None) is None
    for bad in ("<img src=x onerror=alert(1)>", [1], True):
        with pytest.raises(ValueError):
            _opt(int, bad)
