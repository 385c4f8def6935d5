"""telemetry.diagnose: each rule on synthetic series, firing and just missing its threshold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.telemetry.diagnose import Finding, Inputs, Series, Thresholds, diagnose

NOW = 1_000_000.0
GIB = 2**30
TH = Thresholds()

# a healthy 4-GPU DDP job: reported a second ago, bf16 on a GPU that has it, no series yet
JOB = Inputs(now=NOW, status="running", started_at=NOW - 3600, last_report_at=NOW - 1, step=1000,
             seconds_per_step=0.5, world_size=4, on_gpu=True, gpu="A100-80GB", gpu_bf16=True,
             precision="bf16-mixed", strategy="ddp")


def steady(value: float, n: int = 10, start: float = NOW - 50, dt: float = 5.0) -> list[tuple[float, float]]:
    return [(start + i * dt, value) for i in range(n)]


def each(values: list[float], n: int = 10) -> dict[int, list[tuple[float, float]]]:
    """One steady series per rank or device, keyed 0, 1, ..."""
    return {k: steady(v, n) for k, v in enumerate(values)}


def found(inp: Inputs, rule: str) -> list[Finding]:
    return [f for f in diagnose(inp) if f.rule == rule]


def one(inp: Inputs, rule: str) -> Finding:
    hits = found(inp, rule)
    assert len(hits) == 1, hits
    return hits[0]


# --- 1. data loading -------------------------------------------------------------------------

def loading(wait_s: float, util: float | None, n: int = 10) -> Inputs:
    ranks: Series = {"step_time_seconds": each([0.1] * 4, n), "data_wait_seconds": each([wait_s] * 4, n)}
    devices: Series = {} if util is None else {"gpu_utilization": each([util] * 4, n)}
    return replace(JOB, ranks=ranks, devices=devices)


def test_data_loading_fires_on_low_utilization_and_long_waits() -> None:
    f = one(loading(0.061, 0.23), "data_loading")
    assert (f.severity, f.subject) == ("warning", "")
    assert "GPU utilization 23% (mean of 4 devices over 60 s)" in f.detail
    assert "wait 61% of each step" in f.detail
    assert "num_workers" in f.fix


@pytest.mark.parametrize(("wait_s", "util"), [(0.029, 0.23), (0.061, 0.5)])
def test_data_loading_needs_both_low_utilization_and_long_waits(wait_s: float, util: float) -> None:
    assert found(loading(wait_s, util), "data_loading") == []


def test_data_loading_without_utilization_judges_the_wait_alone() -> None:
    f = one(loading(0.061, None), "data_loading")
    assert "61%" in f.detail and "not reported" in f.detail
    assert found(loading(0.029, None), "data_loading") == []


def test_too_few_points_say_nothing() -> None:
    assert found(loading(0.061, 0.23, n=TH.min_points - 1), "data_loading") == []
    assert found(straggling(0.02, n=TH.min_points - 1), "straggler") == []
    assert found(memory_used([0.99], n=TH.min_points - 1), "memory") == []


def test_samples_before_the_window_are_ignored() -> None:
    old = replace(loading(0.061, 0.23), now=NOW + TH.window_s + 60)
    assert diagnose(replace(old, last_report_at=old.now - 1)) == []


# --- 2. memory -------------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total"
    " capacity of 79.15 GiB of which 1.02 GiB is free.",
    "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes.",
    "terminate called after throwing an instance of 'std::bad_alloc'",
])
def test_out_of_memory_in_the_log_is_critical_even_after_failure(line: str) -> None:
    inp = replace(JOB, status="failed", log_tail=("step 10", "  " + line, "exiting"))
    f = one(inp, "memory")
    assert (f.severity, f.subject) == ("critical", "")
    assert f'"{line}"' in f.detail
    assert "checkpointing" in f.fix


def test_killed_next_to_exit_minus_9_is_the_oom_killer() -> None:
    tail = ("/bin/sh: line 1: 4242 Killed  python train.py", "[E] failed (exitcode: -9) local_rank: 0",
            "exitcode  : -9")
    f = one(replace(JOB, status="failed", log_tail=tail), "memory")
    assert f.severity == "critical" and "OOM killer" in f.detail and "4242 Killed" in f.detail
    assert "dmesg" in f.fix


def test_killed_alone_or_far_from_the_exit_is_not_an_oom() -> None:
    assert found(replace(JOB, log_tail=("Killed",)), "memory") == []
    far = ("Killed", *(["noise"] * (TH.log_context_lines + 1)), "Signal 9 (SIGKILL) received by PID 7")
    assert found(replace(JOB, log_tail=far), "memory") == []


def memory_used(shares: list[float], n: int = 10) -> Inputs:
    devices: Series = {"gpu_memory_used_bytes": each([s * 80 * GIB for s in shares], n),
                       "gpu_memory_total_bytes": each([80 * GIB] * len(shares), 1)}
    return replace(JOB, devices=devices)


def test_nearly_full_device_memory_names_the_worst_device() -> None:
    f = one(memory_used([0.5, 0.94, 0.96, 0.5]), "memory")
    assert (f.severity, f.subject) == ("warning", "device 2")
    assert "uses 76.8 GiB of 80.0 GiB (96%)" in f.detail and "also device 1 94%" in f.detail


def test_device_memory_just_under_the_threshold_is_fine() -> None:
    assert found(memory_used([0.89] * 4), "memory") == []


# --- 3. scaling ------------------------------------------------------------------------------

def comm(comm_s: float) -> Inputs:
    return replace(JOB, ranks={"step_time_seconds": each([0.1] * 4), "comm_seconds": each([comm_s] * 4)})


def test_communication_dominating_the_step_is_a_scaling_warning() -> None:
    f = one(comm(0.062), "scaling")
    assert (f.severity, f.subject) == ("warning", "")
    assert "in flight 62% of each step (mean of 4 ranks" in f.detail
    assert "PowerSGD" in f.fix
    assert found(comm(0.049), "scaling") == []


def test_poor_scaling_efficiency_against_the_one_worker_baseline() -> None:
    f = one(replace(JOB, samples_per_s=2100.0, baseline_samples_per_s=1000.0), "scaling")
    assert "Scaling efficiency 52%" in f.detail and "4 workers train 2,100 samples/s" in f.detail
    assert found(replace(JOB, samples_per_s=2840.0, baseline_samples_per_s=1000.0), "scaling") == []
    single = replace(JOB, world_size=1, samples_per_s=100.0, baseline_samples_per_s=1000.0)
    assert found(single, "scaling") == []


def test_both_scaling_conditions_make_one_finding() -> None:
    f = one(replace(comm(0.062), samples_per_s=2100.0, baseline_samples_per_s=1000.0), "scaling")
    assert "62%" in f.detail and "52%" in f.detail


# --- 4. communication timeouts ---------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout:"
    " WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600054 milliseconds",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    " [10.0.0.2]:43210",
    "node1:812:903 [0] NCCL WARN NET/Socket : peer 10.0.0.2<43210> closed connection",
    "RuntimeError: Timed out waiting 1800000ms for recv operation to complete",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process"
    " exited or there was a network error, ncclRemoteError",
])
def test_collective_failures_in_the_log_are_critical_in_any_status(line: str) -> None:
    f = one(replace(JOB, status="failed", log_tail=("step 10", line)), "comm_timeout")
    assert (f.severity, f.subject) == ("critical", "")
    assert "1 line of the last 2 output lines" in f.detail and line.strip()[:60] in f.detail
    assert "NCCL_DEBUG=INFO" in f.fix


@pytest.mark.parametrize("line", [
    "[I ProcessGroupNCCL.cpp:851] ProcessGroupNCCL initialization options: size: 4, TIMEOUT(ms): 600000,"
    " TORCH_NCCL_DUMP_ON_TIMEOUT: 0",
    "urllib3.exceptions.ProtocolError: ('Connection aborted.', Connection reset by peer)",
])
def test_benign_lines_are_not_collective_failures(line: str) -> None:
    assert found(replace(JOB, log_tail=(line,)), "comm_timeout") == []


def test_a_closed_connection_after_an_out_of_memory_is_its_echo_not_a_second_cause() -> None:
    tail = ("[rank 1] RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 4294967296 bytes.",
            "[rank 0] RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
            "Connection closed by peer [127.0.0.1]:43210")
    inp = replace(JOB, status="failed", log_tail=tail)
    assert found(inp, "comm_timeout") == []
    assert one(inp, "memory").severity == "critical"


# a 2-rank run whose rank 0 could not write its checkpoint folder while rank 1 waited in the
# Checkpointer's barrier, as the supervisor's log tail holds it (recorded from a real run;
# paths shortened): rank 1's closed connection and torchrun's summary are knock-on effects
PERMISSION_TAIL = (
    "[rank 0] Traceback (most recent call last):",
    '[rank 0]   File "/home/me/job/train.py", line 41, in <module>',
    "[rank 0]     ckpt.step(step)",
    '[rank 0]   File "/gpufleet/train/checkpointer.py", line 308, in save',
    "[rank 0]     ckpt_modes.make_dir(partial, self.private)",
    "[rank 0] PermissionError: [Errno 13] Permission denied: '/ckpt/step-00000005.partial'",
    "[rank 1] Traceback (most recent call last):",
    '[rank 1]   File "/home/me/job/train.py", line 41, in <module>',
    "[rank 1]     dist.barrier(group=g)",
    '[rank 1]   File "torch/distributed/distributed_c10d.py", line 5356, in barrier',
    "[rank 1]     work.wait()",
    "[rank 1] RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]"
    " Connection closed by peer [127.0.0.1]:57057. This is typically caused by a remote worker"
    " crashing. Check the logs of the remote worker before reporting an error.",
    "W1201 18:37:13.849000 1836 torch/distributed/elastic/multiprocessing/api.py:1028] Sending"
    " process 1899 closing signal SIGTERM",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "  exitcode  : 1 (pid: 1898)",
)


def test_a_rank_that_raised_is_the_cause_and_the_others_closed_connections_are_not_blamed() -> None:
    for status in ("running", "failed"):
        inp = replace(JOB, status=status, log_tail=PERMISSION_TAIL)
        assert found(inp, "comm_timeout") == [], "no 'check the interconnect' for an echo"
        f = one(inp, "worker_error")
        assert (f.severity, f.title) == ("critical", "Rank 0 raised PermissionError")
        assert "Permission denied: '/ckpt/step-00000005.partial'" in f.detail
        assert "rank 1" in f.detail and "not an interconnect problem" in f.detail
        assert "writable" in f.fix and "--rank 0" in f.fix


def test_a_handled_traceback_in_a_job_still_running_is_not_a_worker_error() -> None:
    """logging.exception in a healthy loop prints a traceback; no worker ended, nothing is wrong."""
    tail = ("step 10", "Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
            "ValueError: bad batch, skipped", "step 11")
    assert found(replace(JOB, status="running", log_tail=tail), "worker_error") == []
    assert found(replace(JOB, status="failed", log_tail=tail), "worker_error") != []


def test_after_the_end_a_failed_run_blamed_on_a_rank_is_its_error_without_torchruns_summary() -> None:
    """The diagnosis after the end reads status 'ended'; torchrun's summary may have scrolled out
    of the tail (a launcher SIGTERMed after its workers failed prints its own traceback)."""
    tail = ("[rank 1] Traceback (most recent call last):",
            '[rank 1]   File "train.py", line 47, in <module>',
            "[rank 1] RuntimeError: boom at step 3 on rank 1",
            *("  File \"torch/distributed/run.py\", line 900, in main" for _ in range(30)),
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15")
    ended = replace(JOB, status="ended", log_tail=tail)
    assert found(ended, "worker_error") == []  # no exit code, no blamed rank: a handled traceback
    assert found(replace(ended, exit_code=1), "worker_error") == []
    assert found(replace(ended, failed_rank=1), "worker_error") == []
    f = one(replace(ended, exit_code=1, failed_rank=1), "worker_error")
    assert f.title == "Rank 1 raised RuntimeError" and "boom at step 3" in f.detail


def test_the_lowest_rank_with_its_own_error_is_named_whatever_the_order_of_the_tail() -> None:
    tail = ("[rank 3] Traceback (most recent call last):", "[rank 3] ValueError: bad shape",
            "[rank 1] Traceback (most recent call last):", "[rank 1] KeyError: 'input_ids'",
            "[rank 0] Traceback (most recent call last):",
            "[rank 0] torch.distributed.DistBackendError: NCCL communicator was aborted")
    f = one(replace(JOB, status="failed", log_tail=tail), "worker_error")
    assert f.title == "Rank 1 raised KeyError" and "rank 0" in f.detail


def test_a_real_collective_timeout_on_every_rank_is_still_a_communication_finding() -> None:
    tail = ("[rank 0] Traceback (most recent call last):",
            "[rank 0] RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting"
            " 3000ms for recv operation to complete",
            "[rank 1] Traceback (most recent call last):",
            "[rank 1] torch.distributed.elastic.multiprocessing.api.SignalException: Process 12"
            " got signal: 15")
    inp = replace(JOB, status="failed", log_tail=tail)
    assert found(inp, "worker_error") == []
    assert one(inp, "comm_timeout").severity == "critical"


@pytest.mark.parametrize("tail", [
    ("ValueError: printed, never raised",),  # no traceback: a message, not a crash
    ("[rank 0] Traceback (most recent call last):",
     "[rank 0] RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8"
     " bytes."),  # the memory rule's
])
def test_no_worker_error_without_a_traceback_or_for_out_of_memory(tail: tuple[str, ...]) -> None:
    assert found(replace(JOB, status="failed", log_tail=tail), "worker_error") == []


# --- 5. stragglers ---------------------------------------------------------------------------

def straggling(last_comm_s: float, step_s: float = 0.2, n: int = 10) -> Inputs:
    """Equal step times (synchronous training); the last rank waits least in the all-reduce."""
    ranks: Series = {"step_time_seconds": each([step_s] * 4, n),
                     "comm_seconds": each([0.1, 0.1, 0.1, last_comm_s], n)}
    return replace(JOB, ranks=ranks)


def test_the_rank_that_waits_least_is_the_straggler() -> None:
    f = one(straggling(0.02), "straggler")
    assert (f.severity, f.subject, f.key) == ("warning", "rank 3", "straggler:rank 3")
    assert "180 ms per step against 100 ms" in f.detail and "1.80x" in f.detail
    assert "throttling" in f.fix


def test_a_rank_just_under_the_straggler_ratio_is_fine() -> None:
    assert found(straggling(0.076), "straggler") == []  # busy 124 ms against 100 ms: 1.24x


def test_differences_below_the_minimum_seconds_are_ignored() -> None:
    ranks: Series = {"step_time_seconds": each([0.01] * 4),
                     "comm_seconds": each([0.008, 0.008, 0.008, 0.005])}
    assert found(replace(JOB, ranks=ranks), "straggler") == []  # 5 ms against 2 ms: 2.5x but 3 ms


def test_without_comm_seconds_the_step_times_themselves_are_compared() -> None:
    inp = replace(JOB, world_size=3, strategy="fsdp", ranks={"step_time_seconds": each([0.1, 0.1, 0.15])})
    f = one(inp, "straggler")
    assert f.subject == "rank 2" and "150 ms" in f.detail and "not reported" in f.detail


def test_stragglers_need_two_ranks() -> None:
    assert found(replace(straggling(0.02), world_size=1), "straggler") == []
    lone = replace(JOB, ranks={"step_time_seconds": {3: steady(0.5)}})
    assert found(lone, "straggler") == []


# --- 6. stalls -------------------------------------------------------------------------------

def test_no_report_for_longer_than_the_limit_is_a_stall() -> None:
    f = one(replace(JOB, last_report_at=NOW - 300), "stalled")
    assert (f.severity, f.subject) == ("critical", "")
    assert "No step reported for 5 min 0 s (last step 1000)" in f.detail
    assert "py-spy dump" in f.fix


def test_the_stall_limit_grows_with_slow_steps() -> None:
    assert found(replace(JOB, last_report_at=NOW - 119), "stalled") == []
    slow = replace(JOB, last_report_at=NOW - 190, seconds_per_step=20.0)  # limit 10 x 20 s
    assert found(slow, "stalled") == []
    f = one(replace(slow, last_report_at=NOW - 210), "stalled")
    assert "limit is 3 min 20 s (10 steps of 20 s)" in f.detail


def test_no_first_report_long_after_start_is_a_stall() -> None:
    fresh = replace(JOB, last_report_at=None, step=None, seconds_per_step=None)
    f = one(replace(fresh, started_at=NOW - 700), "stalled")
    assert f.title == "Training has not started" and "11 min 40 s" in f.detail
    assert found(replace(fresh, started_at=NOW - 500), "stalled") == []


# --- 7. precision ----------------------------------------------------------------------------

def test_bf16_on_a_gpu_without_bf16_is_critical() -> None:
    f = one(replace(JOB, gpu="V100-32GB", gpu_bf16=False), "precision")
    assert f.severity == "critical" and "V100-32GB" in f.detail and "fp16-mixed" in f.fix
    assert found(replace(JOB, gpu="cpu", on_gpu=False, gpu_bf16=False), "precision") == []


def test_non_finite_loss_in_the_series_or_the_log() -> None:
    loss = {0: steady(2.0), 1: [*steady(2.0, 9), (NOW - 1, float("nan"))]}
    f = one(replace(JOB, ranks={"loss": loss}), "precision")
    assert f.severity == "warning" and "rank 1 (1 sample)" in f.detail and "warm-up" in f.fix
    f = one(replace(JOB, status="failed", log_tail=("step 40 | loss nan | lr 3e-4",)), "precision")
    assert "loss nan" in f.detail
    assert found(replace(JOB, ranks={"loss": each([2.0, 2.1])}, log_tail=("loss_scale: 1024",)),
                 "precision") == []


T4_FP16 = replace(JOB, gpu="T4", gpu_bf16=False, precision="fp16-mixed")


def skipping(skipped: float, seconds_per_step: float | None = 0.5) -> Inputs:
    """10 reports 5 s apart; skipped_steps counts from 100 up to 100 + skipped."""
    ranks: Series = {"step_time_seconds": {0: steady(0.5)},
                     "skipped_steps": {0: [(t, 100 + skipped * i / 9) for i, (t, _) in enumerate(steady(0))]}}
    return replace(T4_FP16, ranks=ranks, seconds_per_step=seconds_per_step)


def test_many_skipped_fp16_steps_warn() -> None:
    f = one(skipping(9), "precision")  # 45 s at 0.5 s per step: 90 steps
    assert f.severity == "warning" and "9 of about 90 fp16 steps" in f.detail and "(10%)" in f.detail
    assert found(skipping(4), "precision") == []  # 4%


def test_skipped_share_counts_step_samples_before_the_step_time_is_known() -> None:
    f = one(skipping(1, seconds_per_step=None), "precision")  # 9 step samples after the first
    assert "1 of about 9 fp16 steps" in f.detail and "11%" in f.detail


def test_a_loss_scale_below_one_warns() -> None:
    f = one(replace(T4_FP16, ranks={"loss_scale": {0: steady(0.5)}}), "precision")
    assert "fell to 0.5 on rank 0" in f.detail
    assert found(replace(T4_FP16, ranks={"loss_scale": {0: steady(1.0)}}), "precision") == []


def test_precision_advice_for_gpus_with_bf16() -> None:
    fp16 = one(replace(JOB, precision="fp16-mixed"), "precision")
    assert fp16.severity == "info" and "no loss scaling" in fp16.detail
    fp32 = one(replace(JOB, precision="fp32"), "precision")
    assert fp32.severity == "info" and "2x faster" in fp32.detail
    assert found(replace(JOB, precision="fp32", gpu="cpu", on_gpu=False, gpu_bf16=False), "precision") == []


def test_conditions_of_one_rule_merge_into_the_most_severe() -> None:
    inp = replace(skipping(9), gpu="A100-80GB", gpu_bf16=True)
    f = one(inp, "precision")
    assert f.severity == "warning" and "10%" in f.detail and "no loss scaling" in f.detail


# --- the whole ---------------------------------------------------------------------------------

def test_a_healthy_job_has_no_findings() -> None:
    ranks: Series = {"step_time_seconds": each([0.2] * 4), "data_wait_seconds": each([0.01] * 4),
                     "comm_seconds": each([0.05] * 4), "loss": each([2.0] * 4)}
    devices: Series = {"gpu_utilization": each([0.95] * 4)}
    assert diagnose(replace(JOB, ranks=ranks, devices=devices)) == []
    assert diagnose(replace(JOB, last_report_at=None, started_at=None)) == []


def test_a_finished_job_is_judged_by_its_log_only() -> None:
    sick = replace(loading(0.061, 0.23), last_report_at=NOW - 3000, ranks={
        **loading(0.061, 0.23).ranks, "comm_seconds": each([0.1, 0.1, 0.1, 0.0])})
    assert {f.rule for f in diagnose(sick)} == {"data_loading", "straggler", "stalled", "scaling"}
    failed = replace(sick, status="failed", log_tail=("torch.OutOfMemoryError: CUDA out of memory.",))
    assert [(f.rule, f.severity) for f in diagnose(failed)] == [("memory", "critical")]


def test_findings_are_sorted_by_severity_then_rule_order() -> None:
    inp = replace(straggling(0.02), precision="fp32", last_report_at=NOW - 300, devices={},
                  ranks={**straggling(0.02).ranks, "data_wait_seconds": each([0.1] * 4)})
    got = [(f.severity, f.rule) for f in diagnose(inp)]
    assert got == [("critical", "stalled"), ("warning", "data_loading"), ("warning", "straggler"),
                   ("info", "precision")]


def test_keys_are_stable_and_unique() -> None:
    inp = replace(straggling(0.02), samples_per_s=100.0, baseline_samples_per_s=1000.0,
                  log_tail=("Watchdog caught collective operation timeout",) * 3)
    first, again = diagnose(inp), diagnose(replace(inp, now=NOW + 1, last_report_at=NOW))
    assert [f.key for f in first] == [f.key for f in again] == [
        "comm_timeout:", "scaling:", "straggler:rank 3"]
