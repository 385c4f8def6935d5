"""The machine's elastic transitions: when to ask the workers to save and exit for a new size,
when to give that up, how the next run starts at the size the pool could give, and the goodput
verdict on each resize (kept, or reverted to the size before). Pure.
"""

from __future__ import annotations

import re
from dataclasses import replace

from gpufleet.status import JobStatus
from gpufleet.supervise import elastic, goodput
from gpufleet.supervise.events import (
    Action,
    NewLogRun,
    RecordEvent,
    RequestWorkers,
    Resized,
    Say,
    Tick,
    Transition,
)
from gpufleet.supervise.state import Result, State, next_run

POLICY_EVERY_S = 1.0  # an elastic decision at most once a second


def needs_free_devices(state: State, now: float, util: tuple[tuple[float, float], ...]) -> bool:
    """Whether the next Tick must say how many devices the job could grow by: only when the
    utilization asks to grow (finding out needs a look at the pool)."""
    if state.phase != "running" or now - state.last_policy < POLICY_EVERY_S:
        return False
    s, _ = _abandon(state, now)
    decision = _policy_decision(s, now, util, free=None)
    return decision is not None and decision.workers > s.workers


def _abandon(state: State, now: float) -> Result:
    """The workers keep reporting but never reached ckpt.step() (a long evaluation, say):
    past its deadline, give up the resize rather than stay 'resizing' for ever."""
    s = state
    if s.resize_deadline is None or now <= s.resize_deadline:
        return s, []
    seq = s.control_seq + 1
    return replace(s, resize_target=None, resize_deadline=None, control_seq=seq, trial=None), [
        RecordEvent("scale_blocked", f"resize to {s.resize_target} abandoned: the workers did "
                    f"not save within {2 * s.config.hang_timeout_s:.0f} s"),
        RequestWorkers("none", seq),  # supersedes the request, if no rank has read it yet
        Transition(JobStatus.RUNNING, "resize abandoned")]


def autoscale(state: State, tick: Tick, now: float) -> Result:
    s, actions = _abandon(state, now)
    policy = s.config.policy
    if policy is None:
        return s, actions
    if s.trial is not None and s.resize_target is None:
        return _verdict(s, tick, now, actions)
    decision = _policy_decision(s, now, tick.util, tick.free if tick.free is not None else 0)
    if decision is None:
        return s, actions
    if decision.workers == s.workers:
        if "free device" in decision.reason:
            return _blocked(s, decision.reason, actions)
        return replace(s, last_scale_note=""), actions
    if not s.has_checkpointer:
        return _blocked(s, f"would resize {s.workers} -> {decision.workers} ({decision.reason}), "
                        "but the script has no gpufleet.train.Checkpointer: a resize would lose "
                        "its progress", actions)
    before = goodput.measure(tick.progress, s.workers, s.config.usd_per_device_hour,
                             now - policy.window_s, now, reach_back=True)
    if before is None:  # too few steps yet to judge the resize by: wait for them
        return s, actions
    trial = goodput.Trial(before, decision.workers, decision.reason)
    return _request(s, decision.workers, f"{s.workers} -> {decision.workers} workers: "
                    f"{decision.reason}; trying it against {goodput.describe(before)}",
                    now, actions, trial)


def _request(state: State, target: int, reason: str, now: float, actions: list[Action],
             trial: goodput.Trial | None) -> Result:
    """Ask the workers to save and exit for a new size."""
    seq = state.control_seq + 1
    s = replace(state, resize_target=target, control_seq=seq, exit_asked=True, trial=trial,
                resize_deadline=now + 2 * state.config.hang_timeout_s)
    return s, [*actions, RequestWorkers("save_exit", seq), Transition(JobStatus.RESIZING, reason),
               Say(f"resizing {reason}")]


def _verdict(state: State, tick: Tick, now: float, actions: list[Action]) -> Result:
    """Judge the resize once its after window is measured: keep it, or go back."""
    policy, trial = state.config.policy, state.trial
    assert policy is not None and trial is not None
    if state.training_since is None:
        return state, actions
    start, due = goodput.after_window(state.training_since, policy.cooldown_s, policy.window_s)
    after = goodput.measure(tick.progress, state.workers, state.config.usd_per_device_hour,
                            start, now) if now >= due else None
    if after is None:
        return state, actions
    j, holds = goodput.judge(trial, after, policy.tolerance, state.holds, policy.cooldown_s, now)
    s = replace(state, trial=None, judged=(*state.judged, j), holds=holds, last_scale_note="")
    actions = [*actions, RecordEvent(j.verdict.event, j.text), Say(j.text)]
    if j.verdict is goodput.Verdict.KEPT:
        return s, actions
    back = j.before.workers
    return _request(s, back, f"{s.workers} -> {back} workers: reverting ({j.summary})", now,
                    actions, None)


def _policy_decision(state: State, now: float, util: tuple[tuple[float, float], ...],
                     free: int | None) -> elastic.Decision | None:
    """The elastic decision (None: no decision is due). Growing needs the pool's free devices:
    with `free` None, it is first asked as if the pool had room."""
    policy = state.config.policy
    if policy is None or state.resize_target is not None or state.training_since is None \
            or state.trial is not None:
        return None
    allowed = list(state.config.allowed)
    decision = elastic.decide(policy, allowed, state.workers, list(util), now,
                              state.training_since, policy.max_workers, state.holds,
                              state.ran_at)
    if decision.workers > state.workers and free is not None:
        decision = elastic.decide(policy, allowed, state.workers, list(util), now,
                                  state.training_since, free, state.holds, state.ran_at)
    return decision


def _blocked(state: State, reason: str, actions: list[Action]) -> Result:
    """One event per kind of refusal, not one a second: the figures in it change."""
    key = re.sub(r"\d+(\.\d+)?", "#", reason)
    if key == state.last_scale_note:
        return state, actions
    return replace(state, last_scale_note=key), [*actions, RecordEvent("scale_blocked", reason)]


def resized(state: State, done: Resized, now: float) -> Result:
    before, target = state.reshaping or (state.workers, done.workers)
    actions: list[Action] = []
    if done.blocked is not None:
        actions.append(RecordEvent("scale_blocked", f"{before} -> {target} workers: "
                                   f"{done.blocked}; staying at {before}"))
    workers = done.workers
    trial = state.trial  # judged once the new run settles; nothing to judge at the old size
    if trial is not None and (done.blocked is not None or workers != trial.target):
        trial = None
    policy = state.config.policy
    accum = elastic.grad_accum(policy, workers) if policy else 1
    actions += [RecordEvent("resized", f"{before} -> {workers} workers from the checkpoint at "
                            f"step {state.checkpoint_step}; each rank accumulates {accum} "
                            "micro-batch(es) per step"),
                NewLogRun(f"resized {before} -> {workers} workers")]
    s, more = next_run(replace(state, workers=workers, reshaping=None, trial=trial), now)
    return s, [*actions, *more]
