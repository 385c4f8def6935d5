"""The vocabulary of diagnosis: what the rules read (`Inputs`), where they draw the line
(`Thresholds`) and what they say (`Finding`). Pure data, no rules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["info", "warning", "critical"]
# series: metric name -> key (rank for rank metrics, device index for device metrics) ->
# [(unix time, value)], oldest first, covering about the last `Thresholds.window_s` seconds
Series = dict[str, dict[int, list[tuple[float, float]]]]


@dataclass(frozen=True)
class ResizeVerdict:
    """An elastic resize the supervisor judged by goodput (supervise/goodput.py)."""

    before: int  # workers
    after: int
    reverted: bool
    text: str  # the verdict with its figures, as the job's event says it
    trigger: str = ""  # why it was tried: "utilization 0.42 <= 0.50 over 15 s", growing back


@dataclass(frozen=True)
class Inputs:
    now: float
    status: str  # the job's status: starting, running, ...
    started_at: float | None  # when the workers were started
    last_report_at: float | None  # rank 0's last report, None before the first
    step: int | None
    seconds_per_step: float | None  # mean over the run so far, None before two reports
    world_size: int
    on_gpu: bool
    gpu: str  # catalog type name, "cpu" for CPU slots
    gpu_bf16: bool  # the catalog says the GPU type computes in bf16
    precision: str  # fp32, bf16-mixed, fp16-mixed
    strategy: str  # ddp, fsdp, zero1, zero2, zero3, tp, pp
    ranks: Series = field(default_factory=dict)  # step_time_seconds, data_wait_seconds, ...
    devices: Series = field(default_factory=dict)  # gpu_utilization, gpu_memory_used_bytes, ...
    log_tail: tuple[str, ...] = ()  # the workers' last output lines, oldest first
    samples_per_s: float | None = None  # the job's current throughput
    # samples/s of the same script on one worker of the same GPU type (an earlier job), if any
    baseline_samples_per_s: float | None = None
    # whether the job reports its steps (the SDK or the worker bootstrap said so): a script that
    # never reports is not judged for not having started
    reports_expected: bool = True
    job: str = ""  # the job's name, for the commands a fix names
    failed_rank: int | None = None  # the rank the failure reason blames (its error record)
    exit_code: int | None = None  # the workers' exit code, in the round after they ended
    resizes: tuple[ResizeVerdict, ...] = ()  # an elastic job's judged resizes, oldest first


@dataclass(frozen=True)
class Thresholds:
    window_s: float = 60.0  # how much recent telemetry the rules look at
    min_points: int = 3  # fewer samples than this in the window: a rule says nothing
    low_utilization: float = 0.5
    high_data_wait: float = 0.3  # share of the step spent waiting for data
    memory_warning: float = 0.9  # share of device memory in use
    scaling_efficiency: float = 0.7
    comm_dominates: float = 0.5  # share of the step with communication in flight
    straggler: float = 1.25  # a rank's busy time over the median of the others
    straggler_min_s: float = 0.005  # ignore differences below this many seconds per step
    stall_min_s: float = 120.0  # no report for this long (and stall_steps step times) is a stall
    stall_steps: float = 10.0
    startup_s: float = 600.0  # no first report this long after start is a stall too
    skipped_steps: float = 0.05  # share of fp16 steps skipped for overflow
    log_context_lines: int = 10  # "Killed" and an exit -9 this many lines apart are one event


@dataclass(frozen=True)
class Finding:
    rule: str  # data_loading, memory, scaling, comm_timeout, worker_error, straggler, stalled,
    # precision, no_steps, elastic
    severity: Severity
    title: str  # one line: what is wrong
    detail: str  # the evidence, with the numbers
    fix: str  # what to try
    subject: str = ""  # what it is about when not the whole job, e.g. "rank 1"

    @property
    def key(self) -> str:
        """Identity across diagnosis rounds: a finding that stays is the same finding."""
        return f"{self.rule}:{self.subject}"



Points = list[tuple[float, float]]
Rule = Callable[[Inputs, Thresholds], list[Finding]]
