"""The rules about faults: memory running out, collectives timing out, a rank's own error,
precision problems.
They read the workers' output as well as telemetry, so they also explain a job that failed."""

from __future__ import annotations

import math
import re

from gpufleet.telemetry.findings import Finding, Inputs, Thresholds
from gpufleet.telemetry.readings import dur, enough, gib, in_window, pct, plural, quote, running
from gpufleet.telemetry.tracebacks import first_error, is_echo, raised

# --- 2. memory -------------------------------------------------------------------------------

_OOM = re.compile(
    r"CUDA\b.{0,10}out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate memory"
    r"|Cannot allocate memory|std::bad_alloc", re.IGNORECASE)
_KILLED = re.compile(r"\bKilled\b")  # the shell's word for SIGKILL; "killed" in prose is not it
_SIGKILL = re.compile(r"exit\s*(?:code|status)?\s*[:=]?\s*-9\b|Signal 9 \(SIGKILL\)", re.IGNORECASE)

_MEMORY_FIX = ("Turn on activation (gradient) checkpointing, use a smaller micro-batch with gradient"
               " accumulation, shard the model state with ZeRO-3/FSDP, train in bf16 mixed precision,"
               " or add GPUs.")


def _oom_evidence(lines: tuple[str, ...], th: Thresholds) -> tuple[str, bool] | None:
    """The quoted evidence of running out of memory and whether the kernel's OOM killer did it.

    A SIGKILL alone may be a user's or a scheduler's; next to the shell's "Killed" it is most
    likely the kernel freeing host memory.
    """
    for line in lines:
        if _OOM.search(line):
            return quote(line), False
    killed = [i for i, line in enumerate(lines) if _KILLED.search(line)]
    exits = [i for i, line in enumerate(lines) if _SIGKILL.search(line)]
    for k in killed:
        for e in exits:
            if abs(k - e) <= th.log_context_lines:
                quoted = quote(lines[k]) if k == e else f"{quote(lines[k])} and {quote(lines[e])}"
                return quoted, True
    return None


def memory(inp: Inputs, th: Thresholds) -> list[Finding]:
    out = []
    evidence = _oom_evidence(inp.log_tail, th)
    if evidence is not None:
        quoted, host = evidence
        if host:
            detail = (f"A worker was killed with SIGKILL, most likely by the kernel's OOM killer (host"
                      f" memory): {quoted}.")
            fix = ("Check `dmesg` for oom-kill; use fewer DataLoader workers or a smaller"
                   " prefetch_factor, and load the dataset lazily. " + _MEMORY_FIX)
        else:
            detail = f"The workers ran out of memory: {quoted}."
            fix = _MEMORY_FIX
        out.append(Finding(rule="memory", severity="critical", title="Out of memory", detail=detail,
                           fix=fix))
    if not running(inp):
        return out
    totals = inp.devices.get("gpu_memory_total_bytes", {})
    full: list[tuple[float, int, float, float]] = []
    for dev, points in enough(inp.devices, "gpu_memory_used_bytes", inp, th).items():
        # the size never changes, so its latest report counts even from before the window
        sizes = [v for _, v in totals.get(dev, []) if math.isfinite(v) and v > 0]
        if sizes:
            used, total = points[-1][1], sizes[-1]
            if used / total > th.memory_warning:
                full.append((used / total, dev, used, total))
    if full:
        full.sort(key=lambda x: (-x[0], x[1]))
        ratio, dev, used, total = full[0]
        detail = (f"Device {dev} uses {gib(used)} of {gib(total)} ({pct(ratio)}), above"
                  f" {pct(th.memory_warning)}")
        others = ", ".join(f"device {d} {pct(r)}" for r, d, _, _ in full[1:])
        detail += f"; also {others}." if others else "."
        out.append(Finding(rule="memory", severity="warning", title="Device memory nearly full",
                           detail=detail + " A longer sequence or a larger batch may not fit.",
                           fix=_MEMORY_FIX, subject=f"device {dev}"))
    return out


# --- 4. communication timeouts ---------------------------------------------------------------

_COLLECTIVE_FAILED = re.compile(
    r"watchdog caught collective operation timeout|nccl\s+timeout"
    # "TIMEOUT(ms): 1800000" is ProcessGroupNCCL's start-up banner, not a failure
    r"|ProcessGroupNCCL.*(?:timed out|timing out|\btimeout\b(?!\s*\(ms\)))|timed out waiting"
    r"|DistBackendError.*(?:timeout|timed out)|NCCL WARN|ncclRemoteError", re.IGNORECASE)
_PEER_GONE = re.compile(r"connection (?:reset|closed) by peer", re.IGNORECASE)
_C10D = re.compile(r"gloo|c10d|ProcessGroup|torch\.distributed", re.IGNORECASE)


# torchrun's words for a rank it saw end by a signal (SIGKILL: the OOM killer, a kill -9)
_SIGNALLED = re.compile(r"^\s*exitcode\s*:\s*-\d+|Signal \d+ \(SIG\w+\) received")


def comm_timeout(inp: Inputs, th: Thresholds) -> list[Finding]:
    if first_error(inp.log_tail) is not None:
        return []  # a rank raised first: the others' timeouts and closed connections echo it
    hits = [line for line in inp.log_tail if _COLLECTIVE_FAILED.search(line)]
    if hits:
        return [Finding(
            rule="comm_timeout", severity="critical", title="A collective timed out or failed",
            detail=f"{plural(len(hits), 'line')} of the last {len(inp.log_tail)} output lines show"
                   f" a collective timing out or failing; the first: {quote(hits[0])}.",
            fix="Check the interconnect (`gpufleet doctor`); run with NCCL_DEBUG=INFO to see which"
                " link fails; look for a rank that died or is stuck (a straggler); check"
                " NCCL_SOCKET_IFNAME; raise the process-group timeout if the slow step is"
                " legitimate.",
        )]
    # A closed connection alone is how the other ranks see a peer die. When that peer ran out
    # of memory the memory finding is the cause; when torchrun saw it killed by a signal, the
    # job's worker_failed event names it: either way this would only be its echo.
    if any(_OOM.search(line) or _SIGNALLED.search(line) for line in inp.log_tail):
        return []
    hits = [line for line in inp.log_tail if _PEER_GONE.search(line) and _C10D.search(line)]
    if not hits:
        return []
    return [Finding(
        rule="comm_timeout", severity="critical", title="A peer closed its connection mid-collective",
        detail=f"{plural(len(hits), 'line')} of the last {len(inp.log_tail)} output lines show a"
               f" peer's connection closing during a collective; the first: {quote(hits[0])}.",
        fix="Most often the peer's process ended (killed, crashed, out of host memory): the job's"
            " worker_failed event and `gpufleet logs` name which; fix that first. If every rank"
            " was alive, check the interconnect (`gpufleet doctor`), run with NCCL_DEBUG=INFO and"
            " check NCCL_SOCKET_IFNAME.",
    )]


# --- 4b. a rank's own error ------------------------------------------------------------------

_ERROR_FIX = {
    "PermissionError": "Check that the path it names is writable by the user the job runs as "
                       "(a checkpoint folder: the Checkpointer's dir, or --checkpoint-to).",
    "FileNotFoundError": "Check the path it names; a relative path is relative to the job's "
                         "workdir.",
    "ModuleNotFoundError": "Install the module where the workers run (the same Python).",
}


# Errors whose usual cause is known, by their message: a script written for GPUs on CPU slots.
_ERROR_HINTS = (
    (re.compile(r"doesn't have NCCL built in|NCCL is not available|ProcessGroupNCCL is only "
                r"supported with GPUs", re.IGNORECASE),
     "The script asks for the nccl backend, which needs CUDA GPUs; on CPU slots use gloo: its"
     " own option if it has one (nanoGPT: --backend=gloo), or"
     " init_process_group(os.environ.get('GPUFLEET_BACKEND', 'gloo'))."),
    (re.compile(r"_cuda_setDevice|Torch not compiled with CUDA enabled|Found no NVIDIA driver"
                r"|No CUDA GPUs are available", re.IGNORECASE),
     "The script uses CUDA on a cluster of CPU slots (torch.cuda.set_device, .cuda(),"
     " device='cuda'): take the device from its option if it has one (nanoGPT: --device=cpu) or"
     " from GPUFLEET_DEVICE, which gpufleet sets to cpu or cuda."),
)
_ENDING = ("failed", "restarting", "interrupted")
# torchrun's words once a worker has exited: the job is failing even if still 'running'
_RANK_ENDED = re.compile(r"ChildFailedError|^\s*exitcode\s*:|closing signal SIG")


def worker_error(inp: Inputs, th: Thresholds) -> list[Finding]:
    """The traceback that ended a rank, named as the cause (an out-of-memory error is the
    memory rule's); the other ranks' communication errors after it are its echo.

    A rank ended the run when the job is failing, when torchrun's words say so, or, in the
    diagnosis after the end (status 'ended'), when the run failed and its reason blames a rank:
    torchrun's summary can be gone from the tail by then, pushed out by the launcher's last
    words (a launcher slow to end when told is sent SIGTERM, and prints its traceback)."""
    if any(_OOM.search(line) for line in inp.log_tail):
        return []
    blamed = inp.exit_code not in (None, 0) and inp.failed_rank is not None
    if inp.status not in _ENDING and not blamed \
            and not any(_RANK_ENDED.search(ln) for ln in inp.log_tail):
        return []  # a running job that printed a traceback it handled (logging.exception)
    err = first_error(inp.log_tail, inp.failed_rank)
    if err is None:
        return []
    where = "A worker" if err.rank is None else f"Rank {err.rank}"
    echoed = sorted({e.rank for e in raised(inp.log_tail) if e.rank not in (None, err.rank)
                     and is_echo(e.kind, e.line)}, key=lambda r: r or 0)
    detail = f"{where} raised {quote(err.line)}."
    if echoed:
        detail += (f" The errors of {', '.join(f'rank {r}' for r in echoed)} (a peer gone in the"
                   " middle of a collective) followed from it: not an interconnect problem.")
    logs = f"`gpufleet logs {inp.job or 'JOB'}" + ("" if err.rank is None else f" --rank {err.rank}") + "`"
    hint = next((fix for pattern, fix in _ERROR_HINTS if pattern.search(err.line)), None)
    return [Finding(
        rule="worker_error", severity="critical", title=f"{where} raised {err.kind}",
        detail=detail, fix=(hint or _ERROR_FIX.get(err.kind, "Fix the cause in the script or its "
                                                   "environment.")) + f" The whole traceback: {logs}.")]


# --- 7. precision ----------------------------------------------------------------------------

_NAN_LOG = re.compile(r"\bloss\b\s*(?:is\s+|[:=]\s*)?[-+]?(?:nan|inf)\b|\b(?:nan|non-finite) loss\b",
                      re.IGNORECASE)
_NAN_FIX = ("For fp16 the loss scaler should skip such steps; lower the learning rate, add warm-up"
            " and gradient clipping, and use bf16-mixed on GPUs that support it.")


def _skipped_share(inp: Inputs, th: Thresholds) -> tuple[float, float, float] | None:
    """The largest share of steps skipped on any rank in the window: (share, skipped, steps).

    Steps in the span the skipped_steps samples cover are that span over the run's mean seconds
    per step, because a script may report only every Nth step; before a step time is known, each
    step_time sample in the span counts as one step (right when every step is reported).
    """
    best = None
    steps_by_rank = enough(inp.ranks, "step_time_seconds", inp, th)
    for rank, points in enough(inp.ranks, "skipped_steps", inp, th).items():
        (t0, first), (t1, last) = points[0], points[-1]
        if inp.seconds_per_step:
            steps = (t1 - t0) / inp.seconds_per_step
        else:
            steps = float(sum(1 for t, _ in steps_by_rank.get(rank, []) if t0 < t <= t1))
        if steps < 1:
            continue
        skipped = max(0.0, last - first)
        share = min(1.0, skipped / steps)
        if best is None or share > best[0]:
            best = (share, skipped, steps)
    return best


def precision(inp: Inputs, th: Thresholds) -> list[Finding]:
    out = []
    if inp.precision == "bf16-mixed" and inp.on_gpu and not inp.gpu_bf16:
        out.append(Finding(
            rule="precision", severity="critical", title=f"bf16 on {inp.gpu}, which lacks it",
            detail=f"Precision is bf16-mixed but the catalog says {inp.gpu} does not compute in"
                   " bf16: it is emulated (slowly) or refused.",
            fix="Use fp16-mixed with loss scaling, or fp32."))
    if inp.precision == "fp16-mixed" and inp.on_gpu and inp.gpu_bf16:
        out.append(Finding(
            rule="precision", severity="info", title="fp16 where bf16 would do",
            detail=f"Precision is fp16-mixed on {inp.gpu}, which computes in bf16: bf16 has fp32's"
                   " range, so it needs no loss scaling and overflows far less.",
            fix="Use bf16-mixed."))
    if inp.precision == "fp32" and inp.on_gpu and inp.gpu_bf16:
        out.append(Finding(
            rule="precision", severity="info", title="fp32 on a GPU with bf16 tensor cores",
            detail=f"Precision is fp32 on {inp.gpu}; bf16-mixed is usually about 2x faster on its"
                   " tensor cores.",
            fix="Use bf16-mixed."))
    nan_lines = [line for line in inp.log_tail if _NAN_LOG.search(line)]
    if nan_lines:
        out.append(Finding(
            rule="precision", severity="warning", title="Loss is not finite",
            detail=f"The output reports a non-finite loss: {quote(nan_lines[-1])}.", fix=_NAN_FIX))
    if not running(inp):
        return out
    since = inp.now - th.window_s
    # one NaN is proof on its own, so min_points does not apply here
    bad = {r: sum(1 for t, v in pts if t >= since and not math.isfinite(v))
           for r, pts in sorted(inp.ranks.get("loss", {}).items())}
    bad = {r: n for r, n in bad.items() if n}
    if bad:
        ranks = ", ".join(f"rank {r} ({plural(n, 'sample')})" for r, n in bad.items())
        out.append(Finding(
            rule="precision", severity="warning", title="Loss is not finite",
            detail=f"Loss was NaN or infinite in the last {dur(th.window_s)} on {ranks}.",
            fix=_NAN_FIX))
    if inp.precision == "fp16-mixed":
        overflow: list[str] = []
        skipped = _skipped_share(inp, th)
        if skipped is not None and skipped[0] > th.skipped_steps:
            share, count, steps = skipped
            overflow.append(f"{count:.0f} of about {steps:.0f} fp16 steps in the last"
                            f" {dur(th.window_s)} were skipped for overflow ({pct(share)}), above"
                            f" {pct(th.skipped_steps)}.")
        scales = [(v, r) for r, pts in sorted(inp.ranks.get("loss_scale", {}).items())
                  for _, v in in_window(pts, inp, th)]
        if scales and min(scales)[0] < 1.0:
            scale, rank = min(scales)
            overflow.append(f"The loss scale fell to {scale:g} on rank {rank}: gradients overflow"
                            " even scaled down.")
        if overflow:
            out.append(Finding(
                rule="precision", severity="warning", title="fp16 gradients keep overflowing",
                detail=" ".join(overflow),
                fix="Use bf16-mixed where the GPU supports it, lower the learning rate, and clip"
                    " gradients."))
    return out
