"""The machine's elastic transitions: when to ask the workers to save and exit for a new size,
when to give that up, and how the next run starts at the size the pool could give. Pure.
"""

from __future__ import annotations

import re
from dataclasses import replace

from gpufleet.lifecycle.status import JobStatus
from gpufleet.supervise import elastic
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
    return replace(s, resize_target=None, resize_deadline=None, control_seq=seq), [
        RecordEvent("scale_blocked", f"resize to {s.resize_target} abandoned: the workers did "
                    f"not save within {2 * s.config.hang_timeout_s:.0f} s"),
        RequestWorkers("none", seq),  # supersedes the request, if no rank has read it yet
        Transition(JobStatus.RUNNING, "resize abandoned")]


def autoscale(state: State, tick: Tick, now: float) -> Result:
    s, actions = _abandon(state, now)
    decision = _policy_decision(s, now, tick.util, tick.free if tick.free is not None else 0)
    policy = s.config.policy
    if decision is None or policy is None:
        return s, actions
    if decision.workers == s.workers:
        if "free device" in decision.reason:
            return _blocked(s, decision.reason, actions)
        return replace(s, last_scale_note=""), actions
    if not s.has_checkpointer:
        return _blocked(s, f"would resize {s.workers} -> {decision.workers} ({decision.reason}), "
                        "but the script has no gpufleet.train.Checkpointer: a resize would lose "
                        "its progress", actions)
    seq = s.control_seq + 1
    reason = f"{s.workers} -> {decision.workers} workers: {decision.reason}"
    s = replace(s, resize_target=decision.workers, control_seq=seq, exit_asked=True,
                resize_deadline=now + 2 * s.config.hang_timeout_s)
    return s, [*actions, RequestWorkers("save_exit", seq),
               Transition(JobStatus.RESIZING, reason), Say(f"resizing {reason}")]


def _policy_decision(state: State, now: float, util: tuple[tuple[float, float], ...],
                     free: int | None) -> elastic.Decision | None:
    """The elastic decision (None: no decision is due). Growing needs the pool's free devices:
    with `free` None, it is first asked as if the pool had room."""
    policy = state.config.policy
    if policy is None or state.resize_target is not None or state.training_since is None:
        return None
    allowed = list(state.config.allowed)
    decision = elastic.decide(policy, allowed, state.workers, list(util), now,
                              state.training_since, free=policy.max_workers)
    if decision.workers > state.workers and free is not None:
        decision = elastic.decide(policy, allowed, state.workers, list(util), now,
                                  state.training_since, free)
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
    policy = state.config.policy
    accum = elastic.grad_accum(policy, workers) if policy else 1
    actions += [RecordEvent("resized", f"{before} -> {workers} workers from the checkpoint at "
                            f"step {state.checkpoint_step}; each rank accumulates {accum} "
                            "micro-batch(es) per step"),
                NewLogRun(f"resized {before} -> {workers} workers")]
    s, more = next_run(replace(state, workers=workers, reshaping=None), now)
    return s, [*actions, *more]
