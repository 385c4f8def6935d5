"""Diagnosis of ordinary scripts' failures: the rank the reason blames, known causes of scripts
written for GPUs, a peer that vanished, a script that never stepped, a script that never
reports."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.telemetry.diagnose import Finding, Inputs, diagnose

NOW = 1_000_000.0
JOB = Inputs(now=NOW, status="failed", started_at=NOW - 60, last_report_at=None, step=None,
             seconds_per_step=None, world_size=2, on_gpu=False, gpu="cpu", gpu_bf16=False,
             precision="fp32", strategy="ddp", job="nano")
TB = "Traceback (most recent call last):"
NCCL = "RuntimeError: Distributed package doesn't have NCCL built in"
CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] [c10d] Connection"
          " closed by peer [127.0.0.1]:43210")


def rules(inp: Inputs) -> dict[str, Finding]:
    return {f.rule: f for f in diagnose(inp)}


def test_the_finding_blames_the_rank_the_reason_blames_when_both_raised_alike() -> None:
    tail = (f"[rank 0] {TB}", f"[rank 0] {NCCL}", f"[rank 1] {TB}", f"[rank 1] {NCCL}")
    assert rules(replace(JOB, log_tail=tail))["worker_error"].title == "Rank 0 raised RuntimeError"
    told = rules(replace(JOB, log_tail=tail, failed_rank=1))["worker_error"]
    assert told.title == "Rank 1 raised RuntimeError"
    assert "`gpufleet logs nano --rank 1`" in told.fix  # the job's name, the backticks closed


@pytest.mark.parametrize(("line", "words"), [
    (NCCL, "--backend=gloo"),
    ("AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'", "--device=cpu"),
    ("AssertionError: Torch not compiled with CUDA enabled", "GPUFLEET_DEVICE"),
])
def test_a_script_written_for_gpus_on_cpu_slots_is_told_what_to_change(line: str, words: str) -> None:
    f = rules(replace(JOB, log_tail=(f"[rank 0] {TB}", f"[rank 0] {line}")))["worker_error"]
    assert words in f.fix


def test_a_peer_killed_by_a_signal_is_not_an_interconnect_problem() -> None:
    tail = (f"[rank 0] {CLOSED}", "    exitcode  : -9 (pid: 4242)")
    assert "comm_timeout" not in rules(replace(JOB, log_tail=tail))


def test_a_closed_connection_alone_points_at_the_peer_first() -> None:
    f = rules(replace(JOB, status="running", log_tail=(f"[rank 0] {CLOSED}",)))["comm_timeout"]
    assert f.title == "A peer closed its connection mid-collective"
    assert f.fix.startswith("Most often the peer's process ended")


def test_an_exit_0_without_a_step_is_a_warning_only_for_a_job_that_would_report() -> None:
    ended = replace(JOB, status="ended", exit_code=0, reports_expected=True)
    f = rules(ended)["no_steps"]
    assert f.severity == "warning" and "`gpufleet logs nano`" in f.fix
    assert "no_steps" not in rules(replace(ended, reports_expected=False))  # no torch, no report
    assert "no_steps" not in rules(replace(ended, step=3))
    assert "no_steps" not in rules(replace(ended, exit_code=1))
    assert "no_steps" not in rules(replace(ended, status="running"))


def test_a_script_that_never_reports_is_not_said_to_have_not_started() -> None:
    quiet = replace(JOB, status="running", started_at=NOW - 3600)
    assert "stalled" in rules(replace(quiet, reports_expected=True))
    assert "stalled" not in rules(replace(quiet, reports_expected=False))
