"""The rules about speed: a data-loading bottleneck, poor scaling, a straggling rank, a
stalled job. Each reads the recent telemetry of a running job."""

from __future__ import annotations

import statistics

from gpufleet.telemetry.findings import Finding, Inputs, Thresholds
from gpufleet.telemetry.readings import dur, enough, in_window, means, pct, plural, rate, running, step_shares

# --- 1. data loading -------------------------------------------------------------------------

def data_loading(inp: Inputs, th: Thresholds) -> list[Finding]:
    if not running(inp):
        return []
    shares = step_shares(inp, th, "data_wait_seconds")
    if not shares:
        return []
    wait = statistics.fmean(shares.values())
    if wait <= th.high_data_wait:
        return []
    win = dur(th.window_s)
    waiting = f"ranks wait {pct(wait)} of each step for data (mean of {plural(len(shares), 'rank')})"
    util = means(inp.devices, "gpu_utilization", inp, th)
    if util:
        mean_util = statistics.fmean(util.values())
        if mean_util >= th.low_utilization:
            return []
        what = "GPU" if inp.on_gpu else "CPU"
        detail = (f"{what} utilization {pct(mean_util)} (mean of {plural(len(util), 'device')} over {win})"
                  f" while {waiting}.")
    else:
        detail = (f"Over {win} {waiting}; device utilization is not reported, so the wait alone is the"
                  " evidence.")
    return [Finding(
        rule="data_loading", severity="warning", title="Training waits for the data loader",
        detail=detail,
        fix="Give the DataLoader more workers (num_workers), set pin_memory=True and"
            " persistent_workers=True, put the data on local NVMe rather than network storage, and"
            " pre-tokenize or cache the dataset.",
    )]


# --- 3. scaling ------------------------------------------------------------------------------

def scaling(inp: Inputs, th: Thresholds) -> list[Finding]:
    if not running(inp):
        return []
    evidence: list[str] = []
    title = ""
    shares = step_shares(inp, th, "comm_seconds")
    if shares:
        comm = statistics.fmean(shares.values())
        if comm > th.comm_dominates:
            title = "Communication dominates the step"
            evidence.append(f"Gradient all-reduce is in flight {pct(comm)} of each step (mean of"
                            f" {plural(len(shares), 'rank')} over {dur(th.window_s)}), above"
                            f" {pct(th.comm_dominates)}.")
    sps, base, n = inp.samples_per_s, inp.baseline_samples_per_s, inp.world_size
    if n > 1 and sps is not None and base is not None and sps > 0 and base > 0:
        efficiency = sps / (n * base)
        if efficiency < th.scaling_efficiency:
            title = title or "Poor scaling across workers"
            evidence.append(f"Scaling efficiency {pct(efficiency)}: {n} workers train"
                            f" {rate(sps)} samples/s where one {inp.gpu} worker trained"
                            f" {rate(base)} (linear would be {rate(n * base)}), below"
                            f" {pct(th.scaling_efficiency)}.")
    if not evidence:
        return []
    return [Finding(
        rule="scaling", severity="warning", title=title, detail=" ".join(evidence),
        fix="Use a larger per-GPU batch or gradient accumulation (fewer all-reduces per sample),"
            " compress gradients (PowerSGD or the bf16 DDP comm hook), use a faster interconnect"
            " (NVLink/InfiniBand), and check that NCCL uses the right network interface"
            " (NCCL_SOCKET_IFNAME).",
    )]


# --- 5. stragglers ---------------------------------------------------------------------------

def _busy_medians(inp: Inputs, th: Thresholds) -> tuple[dict[int, float], bool]:
    """Per rank, the median step time minus time in the all-reduce; and whether comm was known.

    In synchronous training every rank's step takes as long as the slowest one's, because the
    fast ranks wait inside the all-reduce: the straggler is the rank that waits least. A worker
    reports both numbers in one record, so they share a timestamp; where they do not, the
    medians are subtracted instead.
    """
    steps = enough(inp.ranks, "step_time_seconds", inp, th)
    comms = {r: in_window(p, inp, th) for r, p in inp.ranks.get("comm_seconds", {}).items()}
    have_comm = any(comms.values())
    busy: dict[int, float] = {}
    for rank, points in steps.items():
        comm = dict(comms.get(rank, []))
        paired = [v - comm[t] for t, v in points if t in comm]
        if paired:
            busy[rank] = statistics.median(paired)
        else:
            comm_median = statistics.median(comm.values()) if comm else 0.0
            busy[rank] = statistics.median(v for _, v in points) - comm_median
    return busy, have_comm


def straggler(inp: Inputs, th: Thresholds) -> list[Finding]:
    if not running(inp) or inp.world_size < 2:
        return []
    busy, have_comm = _busy_medians(inp, th)
    if len(busy) < 2:
        return []
    what = ("busy (step time minus all-reduce time)" if have_comm
            else "step time (comm_seconds not reported, so only a rank's own step time can differ)")
    out = []
    for rank, mine in busy.items():
        # the others' median, so that with two ranks the slow one does not pull its own reference up
        others = statistics.median(v for r, v in busy.items() if r != rank)
        if mine > th.straggler * others and mine - others > th.straggler_min_s:
            ratio = f"{mine / others:.2f}x" if others > 0 else "far more"
            out.append(Finding(
                rule="straggler", severity="warning", title=f"Rank {rank} is slower than the others",
                detail=f"Rank {rank} median {what} is {dur(mine)} per step against {dur(others)}"
                       f" for the other {plural(len(busy) - 1, 'rank')} over {dur(th.window_s)}"
                       f" ({ratio}); every rank waits for it.",
                fix="Check that rank's device for throttling (temperature, power) or a noisy"
                    " neighbour; look for uneven data (variable sequence lengths: bucket by length);"
                    " a slower device type or link; CPU contention from data loading on that node.",
                subject=f"rank {rank}",
            ))
    return out


# --- 6. stalls -------------------------------------------------------------------------------

_STALL_FIX = ("A rank may be blocked in a collective (another rank died or took a different branch),"
              " the data loader may be deadlocked (num_workers with fork), or a filesystem may hang."
              " Run `py-spy dump --pid` on the workers; set NCCL_DEBUG=INFO and"
              " TORCH_DISTRIBUTED_DEBUG=DETAIL.")


def stalled(inp: Inputs, th: Thresholds) -> list[Finding]:
    if not running(inp):
        return []
    if inp.last_report_at is not None:
        since = inp.now - inp.last_report_at
        limit, basis = th.stall_min_s, "stall_min_s"
        if inp.seconds_per_step and th.stall_steps * inp.seconds_per_step > limit:
            limit = th.stall_steps * inp.seconds_per_step
            basis = f"{th.stall_steps:g} steps of {dur(inp.seconds_per_step)}"
        if since <= limit:
            return []
        last = f" (last step {inp.step})" if inp.step is not None else ""
        return [Finding(
            rule="stalled", severity="critical", title="Training stalled",
            detail=f"No step reported for {dur(since)}{last}; the limit is {dur(limit)} ({basis}).",
            fix=_STALL_FIX)]
    if inp.reports_expected and inp.started_at is not None and \
            inp.now - inp.started_at > th.startup_s:
        return [Finding(
            rule="stalled", severity="critical", title="Training has not started",
            detail=f"No step reported {dur(inp.now - inp.started_at)} after the workers started"
                   f" (limit {dur(th.startup_s)}).",
            fix="The workers may be stuck at rendezvous (a node cannot reach the master address) or"
                " still downloading a model or dataset. " + _STALL_FIX)]
    return []


# --- 8. a run that never trained ---------------------------------------------------------------

def no_steps(inp: Inputs, th: Thresholds) -> list[Finding]:
    """Workers that exited 0 without one optimizer step: "succeeded" is true of the exit code,
    not of the training (a script that found too few GPUs and returned, a wrong entry point).
    Only judged when the job was expected to report (its bootstrap armed, or the SDK)."""
    if inp.status != "ended" or inp.exit_code != 0 or not inp.reports_expected \
            or inp.step is not None:
        return []
    return [Finding(
        rule="no_steps", severity="warning", title="The workers exited without a training step",
        detail="Every worker exited 0, but no optimizer step was seen: the script may have"
               " returned early (too few devices, a missing dataset, an argument that skips"
               " training).",
        fix=f"Read the script's own output: `gpufleet logs {inp.job or 'JOB'}`.",
    )]
