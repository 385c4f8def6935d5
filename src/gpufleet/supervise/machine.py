"""The supervisor's decisions as a state machine: `step(state, event, now) -> (state, actions)`.

Pure: no clock (the time comes in as `now`), no store, no process. Everything that decides what
happens to a job (restart or give up, after how long; hung or not; grow, shrink or stay; heal
lost nodes; which final status) is here or in the pure cores it calls (`restarts`, `hang`,
`elastic`, `outcome`), so it is tested event by event in milliseconds, and the supervisor
process only turns I/O into events and actions into I/O.

Phases: idle (not started) -> running (the workers run; a resize may be pending) -> one of
backoff (after a failure, before a restart), healing (replacing lost nodes), reshaping (the
reservation changes for a resize) -> running again ... -> done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from gpufleet.lifecycle.status import JobStatus
from gpufleet.supervise import elastic, hang, outcome, restarts
from gpufleet.supervise.events import (
    Action,
    BackoffOver,
    Begin,
    EndWorkers,
    Event,
    Finish,
    Heal,
    Healed,
    Interrupted,
    NewLogRun,
    RecordEvent,
    Reported,
    RequestWorkers,
    Resize,
    ResizeAcknowledged,
    Resized,
    Say,
    StartWorkers,
    StopRequested,
    SupervisorFailed,
    Tick,
    Transition,
    Wait,
    WorkerNote,
    WorkersExited,
    WorkersStarted,
)

Phase = Literal["idle", "running", "backoff", "healing", "reshaping", "done"]
INTERRUPTED_REASON = "interrupted by user (Ctrl-C)"
POLICY_EVERY_S = 1.0  # an elastic decision at most once a second
STARTUP_GRACE_S = 120.0  # before a first report, on top of the hang timeout


@dataclass(frozen=True)
class Config:
    """What the machine knows of the job that never changes while it runs."""

    cluster_name: str
    max_restarts: int
    hang_timeout_s: float
    policy: elastic.Policy | None = None  # an elastic job's
    allowed: tuple[int, ...] = ()  # the sizes an elastic job may take
    heals: bool = False  # the engine can lose nodes: heal before every run after the first


@dataclass(frozen=True)
class State:
    config: Config
    workers: int
    step: int | None = None  # the latest step rank 0 reported (over all runs)
    phase: Phase = "idle"
    runs: int = 0
    started_at: float = 0.0  # of this run
    training_since: float | None = None  # this run's first report
    last_seen: dict[int, tuple[float, int]] = field(default_factory=dict)  # rank -> (time, step)
    ever_reported: bool = False
    checkpoint_step: int | None = None
    has_checkpointer: bool = False
    exited_for_resize: bool = False
    failures: tuple[restarts.Failure, ...] = ()
    final_failure: str | None = None
    stop_reason: str | None = None
    interrupted: bool = False
    error: str | None = None
    exit_code: int | None = None
    control_seq: int = 0
    resize_target: int | None = None
    resize_deadline: float | None = None
    reshaping: tuple[int, int] | None = None  # (before, target) while the reservation changes
    last_scale_note: str = ""
    last_policy: float = 0.0

    @property
    def ending(self) -> outcome.Ending:
        return outcome.Ending(self.exit_code, self.error, self.final_failure, self.stop_reason,
                              self.exited_for_resize)

    @property
    def hang_timeout_s(self) -> float:
        """Doubled while the workers save for a resize."""
        return self.config.hang_timeout_s * (2 if self.resize_deadline is not None else 1)


Result = tuple[State, list[Action]]


def initial(config: Config, workers: int, step: int | None = None) -> State:
    return State(config=config, workers=workers, step=step)


def needs_process_states(state: State, now: float) -> bool:
    """Whether the next Tick must say which worker processes are stopped: only when no rank
    reported within the hang timeout (the common case needs no look at every process)."""
    return state.phase == "running" and not (
        state.last_seen and now - max(t for t, _ in state.last_seen.values()) <= state.hang_timeout_s)


def needs_free_devices(state: State, now: float, util: tuple[tuple[float, float], ...]) -> bool:
    """Whether the next Tick must say how many devices the job could grow by: only when the
    utilization asks to grow (finding out needs a look at the pool)."""
    if state.phase != "running" or now - state.last_policy < POLICY_EVERY_S:
        return False
    s, _ = _abandon(state, now)
    decision = _policy_decision(s, now, util, free=None)
    return decision is not None and decision.workers > s.workers


def step(state: State, event: Event, now: float) -> Result:
    """The state after `event` at time `now`, and what to do about it, in order."""
    match event:
        case Begin():
            return _start(state, now) if state.phase == "idle" else (state, [])
        case WorkersStarted():
            return replace(state, started_at=now), []
        case Reported(rank=rank, step=at):
            return replace(state, last_seen={**state.last_seen, rank: (now, at)},
                           ever_reported=True,
                           training_since=now if state.training_since is None
                           else state.training_since,
                           step=at if rank == 0 else state.step), []
        case WorkerNote():
            return _note(state, event, now), []
        case ResizeAcknowledged(seq=seq):
            acked = state.resize_target is not None and seq == state.control_seq
            return replace(state, exited_for_resize=state.exited_for_resize or acked), []
        case Tick():
            return _tick(state, event, now) if state.phase == "running" else (state, [])
        case WorkersExited():
            return _exited(state, event, now) if state.phase == "running" else (state, [])
        case StopRequested(reason=reason):
            return _stop(replace(state, stop_reason=state.stop_reason or reason))
        case BackoffOver():
            if state.phase != "backoff":
                return state, []
            if state.stop_reason is not None:
                return _finish(state, state.exit_code)
            last = state.failures[-1]
            s, actions = _next_run(state, now)
            return s, [NewLogRun(f"restart {len(state.failures)}: {last.description}"), *actions]
        case Healed():
            if state.phase != "healing":
                return state, []
            said: list[Action] = []
            for note in event.notes:
                said += [RecordEvent("node_replaced", note), Say(note)]
            s, actions = _start(replace(state, workers=event.workers), now)
            return s, [*said, *actions]
        case Resized():
            return _resized(state, event, now) if state.phase == "reshaping" else (state, [])
        case SupervisorFailed(error=error):
            return replace(state, error=error, exit_code=None, phase="done"), [Finish(None)]
        case Interrupted():
            return replace(state, interrupted=True, exit_code=None, phase="done",
                           stop_reason=state.stop_reason or INTERRUPTED_REASON), [Finish(None)]
    raise TypeError(f"not a supervisor event: {event!r}")


def _start(state: State, now: float) -> Result:
    """A new run of the workers at the current size."""
    runs = state.runs + 1
    s = replace(state, phase="running", runs=runs, started_at=now, training_since=None,
                last_seen={}, exited_for_resize=False, last_policy=0.0)
    actions: list[Action] = [StartWorkers(s.workers, runs)]
    if runs > 1:
        actions.append(Transition(JobStatus.RUNNING, f"{s.workers} worker(s) on "
                                  f"{s.config.cluster_name} (run {runs})",
                                  {"world_size": s.workers}))
    return s, actions


def _next_run(state: State, now: float) -> Result:
    if state.config.heals:
        return replace(state, phase="healing"), [Heal()]
    return _start(state, now)


def _finish(state: State, code: int | None, *first: Action) -> Result:
    return replace(state, phase="done", exit_code=code), [*first, Finish(code)]


def _note(state: State, note: WorkerNote, now: float) -> State:
    seen = state.last_seen
    if note.rank in seen:  # a sign of life, but only reports start the hang clock
        seen = {**seen, note.rank: (now, seen[note.rank][1])}
    s = replace(state, last_seen=seen)
    if note.kind == "checkpointer":
        return replace(s, has_checkpointer=True)
    if note.kind in ("checkpoint", "resumed"):
        return replace(s, checkpoint_step=note.step)
    if note.kind == "exit_for_resize":
        return replace(s, exited_for_resize=True)
    return s


def _stop(state: State) -> Result:
    if state.phase == "running":  # the workers are ended, not exited: no exit code
        return _finish(replace(state, exited_for_resize=False), None, EndWorkers(10.0))
    if state.phase in ("backoff", "healing", "reshaping"):
        return _finish(state, state.exit_code)
    return state, []  # done already (the reason still counts for the final status)


def _exited(state: State, ex: WorkersExited, now: float) -> Result:
    left_for_resize = ex.code == 0 and state.exited_for_resize
    if state.stop_reason is not None:
        return _finish(replace(state, exited_for_resize=left_for_resize), ex.code)
    if ex.code == 0 and not left_for_resize:
        return _finish(state, 0)
    if left_for_resize:  # the workers saved and left
        target = state.resize_target if state.resize_target is not None else state.workers
        return replace(state, phase="reshaping", exit_code=0, resize_target=None,
                       resize_deadline=None, reshaping=(state.workers, target)), \
            [Resize(state.workers, target)]
    return _failed(state, ex, None, now)


def _failed(state: State, ex: WorkersExited | None, found: hang.Hang | None,
            now: float) -> Result:
    """A failed exit or a hang: record it, then restart after a backoff or give up."""
    code = ex.code if ex is not None else None
    last_lines = ex.last_lines if ex is not None else ""
    failure = outcome.failure(ex, found, state.step, state.checkpoint_step)
    failures = (*state.failures, failure)
    s = replace(state, failures=failures, resize_target=None, resize_deadline=None,
                exit_code=code)  # a failure ends a pending resize
    decision = restarts.decide(list(failures), state.config.max_restarts)
    actions: list[Action] = [EndWorkers(0.0)] if found is not None else []
    actions.append(RecordEvent("hang" if found is not None else "worker_failed",
                               failure.description
                               + (f"\nlast lines:\n{last_lines}" if last_lines else "")))
    if not decision.restart:
        if state.config.max_restarts or found is not None:
            s = replace(s, final_failure=decision.reason
                        + (f"; last lines:\n{last_lines}" if last_lines else ""))
        return _finish(s, code, *actions)  # else the failure reads as it always has (outcome)
    lost = restarts.steps_lost(failure)
    since = (f"the checkpoint at step {failure.checkpoint_step}"
             if failure.checkpoint_step else "the start (no checkpoint yet)")
    when = "now" if decision.delay_s == 0 else f"in {decision.delay_s:.0f} s"
    note = (f"{decision.reason} {when}, from {since}"
            + (f"; {lost} step(s) are redone" if lost is not None else ""))
    text = f"{failure.description}; {note}"
    return replace(s, phase="backoff"), [*actions, Transition(JobStatus.RESTARTING, text),
                                         Say(text), Wait(decision.delay_s)]


def _tick(state: State, tick: Tick, now: float) -> Result:
    startup = state.hang_timeout_s + STARTUP_GRACE_S if state.ever_reported else None
    # Before the first report, a script that reported in an earlier run gets the timeout plus
    # start-up time; one that never reported is not judged by reports.
    found = hang.find(now, state.last_seen, state.started_at, state.hang_timeout_s,
                      dict(tick.stopped), startup) if needs_process_states(state, now) else None
    if found is not None:
        return _failed(state, None, found, now)
    if now - state.last_policy < POLICY_EVERY_S:
        return state, []
    return _autoscale(replace(state, last_policy=now), tick, now)


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


def _autoscale(state: State, tick: Tick, now: float) -> Result:
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
    s = replace(s, resize_target=decision.workers, control_seq=seq,
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


def _resized(state: State, done: Resized, now: float) -> Result:
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
    s, more = _next_run(replace(state, workers=workers, reshaping=None), now)
    return s, [*actions, *more]
