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

from dataclasses import replace

from gpufleet import durable_copy
from gpufleet.status import JobStatus
from gpufleet.supervise import hang, outcome, restarts
from gpufleet.supervise.events import (
    Action,
    BackoffOver,
    Begin,
    EndWorkers,
    Event,
    Finish,
    Healed,
    Interrupted,
    NewLogRun,
    RecordEvent,
    Reported,
    Resize,
    ResizeAcknowledged,
    Resized,
    Say,
    StopRequested,
    SupervisorFailed,
    Tick,
    Transition,
    Wait,
    WorkerNote,
    WorkersExited,
    WorkersStarted,
)
from gpufleet.supervise.resizing import POLICY_EVERY_S, autoscale, needs_free_devices, resized
from gpufleet.supervise.state import Config, Phase, Result, State, initial, next_run, start_run

__all__ = ["POLICY_EVERY_S", "Config", "Phase", "State", "initial", "needs_free_devices",
           "needs_process_states", "step"]

INTERRUPTED_REASON = "interrupted by user (Ctrl-C)"
STARTUP_GRACE_S = 120.0  # before a first report, on top of the hang timeout


def needs_process_states(state: State, now: float) -> bool:
    """Whether the next Tick must say which worker processes are stopped: only when no rank
    reported within the hang timeout (the common case needs no look at every process)."""
    return state.phase == "running" and not (
        state.last_seen and now - max(t for t, _ in state.last_seen.values()) <= state.hang_timeout_s)


def step(state: State, event: Event, now: float) -> Result:
    """The state after `event` at time `now`, and what to do about it, in order."""
    match event:
        case Begin():
            return start_run(state, now) if state.phase == "idle" else (state, [])
        case WorkersStarted():
            first = now if state.first_started_at is None else state.first_started_at
            return replace(state, started_at=now, first_started_at=first), []
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
            over = over_time(state, now)
            if over is not None:
                return _stop(replace(state, stop_reason=over))
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
            s, actions = next_run(state, now)
            return s, [NewLogRun(f"restart {len(state.failures)}: {last.description}"), *actions]
        case Healed():
            if state.phase != "healing":
                return state, []
            said: list[Action] = []
            for note in event.notes:
                said += [RecordEvent("node_replaced", note), Say(note)]
            s, actions = start_run(replace(state, workers=event.workers), now)
            return s, [*said, *actions]
        case Resized():
            return resized(state, event, now) if state.phase == "reshaping" else (state, [])
        case SupervisorFailed(error=error):
            return replace(state, error=error, exit_code=None, phase="done"), [Finish(None)]
        case Interrupted():
            return replace(state, interrupted=True, exit_code=None, phase="done",
                           stop_reason=state.stop_reason or INTERRUPTED_REASON), [Finish(None)]
    raise TypeError(f"not a supervisor event: {event!r}")


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
    if note.kind == durable_copy.CopyEvent.COPIED and note.step is not None:
        return replace(s, copied_step=max(note.step, s.copied_step or 0))
    if note.kind == "exit_for_resize":
        # a control note counts only as the answer to a request of this run (one withdrawn at
        # its deadline too: a rank may have read it first); unasked, an exit 0 is the end
        return replace(s, exited_for_resize=True) if s.exit_asked else s
    return s


def over_time(state: State, now: float) -> str | None:
    """The stop reason once the job has run past its time limit (counted from its first start,
    restarts and backoffs included, as a queue that planned with it counts it)."""
    limit, first = state.config.time_limit_s, state.first_started_at
    if limit is None or first is None or state.stop_reason is not None or state.phase == "done":
        return None
    if now - first < limit:
        return None
    return f"ran past its time limit ({_seconds(limit)}); stopped by gpufleet"


def _seconds(s: float) -> str:
    return f"{s / 3600:g}h" if s >= 3600 else f"{s / 60:g}m" if s >= 60 else f"{s:g}s"


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
    # a failure ends a pending resize (and its trial; a resize done is still judged after)
    trial = None if state.resize_target is not None else state.trial
    s = replace(state, failures=failures, resize_target=None, resize_deadline=None,
                exit_code=code, trial=trial)
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
    when = "now" if decision.delay_s == 0 else f"in {decision.delay_s:.0f} s"
    resumes = restarts.resumes_after_loss(failure, state.copied_step, state.config.durable,
                                          state.has_checkpointer) \
        if ex is not None and ex.node_lost else restarts.resumes_from(failure,
                                                                      state.has_checkpointer)
    note = f"{decision.reason} {when}, {resumes}"
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
    return autoscale(replace(state, last_policy=now), tick, now)
