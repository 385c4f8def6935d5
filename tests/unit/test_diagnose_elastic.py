"""telemetry.rules_elastic: a resized job's diagnosis tells each verdict with its figures."""

from __future__ import annotations

from dataclasses import replace

from gpufleet.telemetry.diagnose import Inputs, diagnose
from gpufleet.telemetry.findings import ResizeVerdict

NOW = 1_000_000.0
JOB = Inputs(now=NOW, status="running", started_at=NOW - 600, last_report_at=NOW - 1, step=100,
             seconds_per_step=0.4, world_size=2, on_gpu=False, gpu="cpu", gpu_bf16=False,
             precision="fp32", strategy="ddp")
REVERTED = ResizeVerdict(2, 1, True, "throughput fell 82% after 2 -> 1 (413 -> 74.0 samples/s; "
                         "samples per $ 16.7M -> 5.97M, -64%, more than the 10% tolerance); "
                         "reverted to 2; no shrinking for 5m", "utilization 0.42 <= 0.50 over 15 s")
KEPT = ResizeVerdict(2, 1, False, "throughput fell 3% after 2 -> 1 (413 -> 400 samples/s; "
                     "samples per $ 16.7M -> 32.3M, +94%); kept 1; no growing for 5m")


def test_a_job_never_resized_has_no_elastic_finding() -> None:
    assert [f for f in diagnose(JOB) if f.rule == "elastic"] == []


def test_a_reverted_shrink_is_a_warning_with_its_figures_and_what_to_change() -> None:
    (f,) = diagnose(replace(JOB, resizes=(REVERTED,)))
    assert (f.rule, f.severity, f.subject) == ("elastic", "warning", "resize 1 (2 -> 1)")
    assert f.title == "Shrinking 2 -> 1 workers lowered goodput; reverted"
    assert f.detail.startswith("Throughput fell 82% after 2 -> 1 (413 -> 74.0 samples/s;")
    assert "; reverted to 2; no shrinking for 5m. It was tried on utilization 0.42 <= 0.50 over " \
        "15 s. Low utilization did not mean too many workers" in f.detail
    assert "--scale-down-util" in f.fix


def test_a_reverted_grow_says_the_workers_did_not_pay_for_themselves() -> None:
    grow = replace(REVERTED, before=1, after=2)
    (f,) = diagnose(replace(JOB, resizes=(grow,)))
    assert f.title == "Growing 1 -> 2 workers did not pay for itself; reverted"
    assert "--scale-tolerance" in f.fix


def test_every_verdict_is_its_own_finding_and_stays_after_the_end() -> None:
    found = diagnose(replace(JOB, status="ended", exit_code=0, resizes=(KEPT, REVERTED)))
    assert [(f.severity, f.key) for f in found] == [("warning", "elastic:resize 2 (2 -> 1)"),
                                                    ("info", "elastic:resize 1 (2 -> 1)")]
    assert found[1].title == "Resized 2 -> 1 workers, kept on goodput"
