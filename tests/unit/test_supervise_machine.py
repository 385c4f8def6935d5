"""supervise.machine and supervise.outcome: the supervisor's decisions, event by event, with no
process, store or clock: restarts and their backoff, the same-failure stop, hangs, elastic
resizes, stops at every phase, node loss, and every final status."""

from __future__ import annotations

from gpufleet.lifecycle.jobs import STOP_REQUESTED
from gpufleet.status import JobStatus
from gpufleet.supervise import elastic, machine, outcome
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
from gpufleet.supervise.goodput import Mark
from gpufleet.supervise.machine import Config, State

BOOM = WorkersExited(1, rank=1, rank_code=1, error="ValueError: boom", last_lines="x\nValueError: boom")
BOOM_TEXT = "rank 1 failed (exit code 1): ValueError: boom"
SIGTERM_REASON = "stopped by SIGTERM (gpufleet stop, or the system)"


def _config(**fields: object) -> Config:
    base: dict[str, object] = {"cluster_name": "c", "max_restarts": 3, "hang_timeout_s": 60.0}
    return Config(**{**base, **fields})  # type: ignore[arg-type]


def _feed(state: State, *events: Event, now: float = 0.0) -> tuple[State, list[Action]]:
    actions: list[Action] = []
    for event in events:
        state, more = machine.step(state, event, now)
        actions += more
    return state, actions


def _running(workers: int = 2, **fields: object) -> State:
    state, _ = _feed(machine.initial(_config(**fields), workers), Begin(), WorkersStarted())
    return state


def _final(state: State, asked: str | None = None,
           tail: outcome.Tail | None = None) -> tuple[JobStatus, str]:
    return outcome.final(state.ending, asked, STOP_REQUESTED, tail)


# -- success and plain exits ---------------------------------------------------------------------

def test_a_clean_exit_succeeds() -> None:
    state, actions = _feed(machine.initial(_config(), 2), Begin())
    assert actions == [StartWorkers(2, 1)]  # the first run is announced by begin_running
    state, actions = _feed(state, WorkersStarted(), Reported(0, 5), WorkersExited(0), now=3.0)
    assert actions == [Finish(0)] and state.phase == "done" and state.step == 5
    assert _final(state) == (JobStatus.SUCCEEDED, "all workers exited 0")


def test_without_restarts_a_failure_reads_from_the_logs() -> None:
    state, actions = _feed(_running(max_restarts=0), BOOM)
    assert actions == [RecordEvent("worker_failed", f"{BOOM_TEXT}\nlast lines:\nx\nValueError: boom"),
                       Finish(1)]
    assert state.final_failure is None  # reads as it always has:
    tail = outcome.Tail(1, 1, ("x", "ValueError: boom"))
    assert _final(state, tail=tail) == (
        JobStatus.FAILED, "rank 1 failed: ValueError: boom (exit code 1); last lines:\nx\nValueError: boom")
    assert _final(state, tail=outcome.Tail(None, None, ("bye",))) == (
        JobStatus.FAILED, "a worker failed (exit code 1); last lines:\nbye")
    assert _final(state) == (JobStatus.FAILED, "torchrun exited with code 1")  # no logs


# -- restarts ----------------------------------------------------------------------------------

def test_a_first_failure_restarts_at_once_then_starts_run_two() -> None:
    state, _ = _feed(_running(), Reported(0, 5), Reported(1, 5))
    state, actions = _feed(state, BOOM, now=10.0)
    note = (f"{BOOM_TEXT}; restart 1 of 3 now, gpufleet holds no checkpoint: the script restarts "
            "as written (it may resume from its own checkpoints)")
    assert actions == [RecordEvent("worker_failed", f"{BOOM_TEXT}\nlast lines:\nx\nValueError: boom"),
                       Transition(JobStatus.RESTARTING, note), Say(note), Wait(0.0)]
    assert state.phase == "backoff" and state.exit_code == 1
    state, actions = _feed(state, BackoffOver(), now=10.0)
    assert actions == [NewLogRun(f"restart 1: {BOOM_TEXT}"), StartWorkers(2, 2),
                       Transition(JobStatus.RUNNING, "2 worker(s) on c (run 2)", {"world_size": 2})]
    assert state.phase == "running" and state.runs == 2 and state.last_seen == {}


def test_failures_with_no_new_checkpoint_back_off_longer_and_a_checkpoint_resets_it() -> None:
    state = _running(max_restarts=10)
    waits = []
    for code in (1, 2, 3):  # three different failures: no same-failure stop
        state, actions = _feed(state, WorkersExited(code), now=1.0)
        waits += [a.seconds for a in actions if isinstance(a, Wait)]
        state, _ = _feed(state, BackoffOver(), WorkersStarted())
    assert waits == [0.0, 1.0, 2.0]
    state, _ = _feed(state, WorkerNote("checkpoint", 0, 40), Reported(0, 44))
    state, actions = _feed(state, WorkersExited(4))
    assert Wait(0.0) in actions
    [text] = [a.reason for a in actions if isinstance(a, Transition)]
    assert text == ("a worker failed (exit code 4); restart 4 of 10 now, from gpufleet's checkpoint "
                    "at step 40; 4 step(s) are redone")


def test_the_same_failure_three_times_in_a_row_stops_restarting() -> None:
    state = _running(max_restarts=10)
    for _ in range(2):
        state, _ = _feed(state, BOOM, BackoffOver(), WorkersStarted())
    state, actions = _feed(state, BOOM)
    assert actions[-1] == Finish(1) and state.phase == "done"
    reason = (f"failed 3 times in a row the same way, each time with no checkpoint of "
              f"gpufleet's: {BOOM_TEXT}; not restarting again (fix the cause, then gpufleet run "
              "--resume); last lines:\nx\nValueError: boom")
    assert state.final_failure == reason and _final(state) == (JobStatus.FAILED, reason)


def test_restarts_give_up_after_max_restarts() -> None:
    state, _ = _feed(_running(max_restarts=1), WorkersExited(-9), BackoffOver(), WorkersStarted())
    state, actions = _feed(state, BOOM)
    assert actions[-1] == Finish(1)
    assert _final(state) == (JobStatus.FAILED, f"{BOOM_TEXT}; gave up after 1 restart(s) "
                             "(--max-restarts 1); last lines:\nx\nValueError: boom")
    assert state.failures[0].description == "a worker failed (killed by SIGKILL)"


# -- hangs -------------------------------------------------------------------------------------

def test_a_hang_is_found_only_past_the_timeout_and_ends_the_workers_at_once() -> None:
    state, _ = _feed(_running(max_restarts=0), Reported(0, 5), Reported(1, 5), now=0.0)
    assert not machine.needs_process_states(state, 30.0)  # reports are fresh: no process look
    state, actions = _feed(state, Tick(), now=30.0)
    assert actions == [] and state.phase == "running"
    assert machine.needs_process_states(state, 61.0)
    state, actions = _feed(state, Tick(stopped={1: True}), now=61.0)
    text = "no rank reported for 61 s (hang timeout 60 s); rank 1 is stopped (SIGSTOP or a debugger)"
    assert actions == [EndWorkers(0.0), RecordEvent("hang", text), Finish(None)]
    # a hang fails the job with its reason even with restarts off
    assert _final(state) == (JobStatus.FAILED, f"{text} (restarts are off: --max-restarts 0)")


def test_a_hang_restarts_like_a_failure() -> None:
    state, _ = _feed(_running(), Reported(0, 5), Reported(1, 3), now=0.0)
    state, actions = _feed(state, Tick(), now=100.0)
    assert actions[0] == EndWorkers(0.0) and isinstance(actions[-1], Wait)
    assert state.failures[-1].signature == "hang: rank 1" and state.exit_code is None


def test_before_any_report_only_a_script_that_reported_before_is_judged() -> None:
    state = _running()
    assert _feed(state, Tick(), now=10_000.0)[1] == []  # may never report: not judged
    state, _ = _feed(state, Reported(0, 1), WorkersExited(1), BackoffOver(), now=0.0)
    state, _ = _feed(state, WorkersStarted(), now=1000.0)  # run 2 starts at t=1000
    assert _feed(state, Tick(), now=1000.0 + 180.0)[1] == []  # timeout + 120 s start-up
    _, actions = _feed(state, Tick(), now=1000.0 + 181.0)
    assert RecordEvent("hang", "no rank reported within 180 s of starting") in actions


# -- elastic resizes ---------------------------------------------------------------------------

POLICY = elastic.Policy(1, 4, scale_up_util=0.9, scale_down_util=0.2, cooldown_s=10.0)


def _elastic(checkpointer: bool = True) -> State:
    state = _running(policy=POLICY, allowed=(1, 2, 4))
    events: list[Event] = [Reported(0, 7), Reported(1, 7)]
    if checkpointer:
        events.append(WorkerNote("checkpointer", 0))
    state, _ = _feed(state, *events, now=0.0)
    return state


def _util(value: float, until: float = 20.0) -> tuple[tuple[float, float], ...]:
    return tuple((float(t), value) for t in range(int(until) + 1))


def _marks(until: float, start: float = 0.0, steps_per_s: float = 2.0,
           per_step: int = 8) -> tuple[Mark, ...]:
    """Rank 0's reports from `start` to `until`, at `steps_per_s`, `per_step` samples each."""
    n = int((until - start) * steps_per_s)
    return tuple(Mark(start + i / steps_per_s, i, i * per_step) for i in range(n + 1))


def _tick(state: State, now: float, util: tuple[tuple[float, float], ...],
          free: int | None = None, progress: tuple[Mark, ...] | None = None,
          ) -> tuple[State, list[Action]]:
    state, _ = _feed(state, Reported(0, 7), Reported(1, 7), now=now)  # still alive
    marks = _marks(now) if progress is None else progress
    return _feed(state, Tick(util, free=free, progress=marks), now=now)


def test_high_utilization_grows_the_job_through_a_save_and_a_new_run() -> None:
    state = _elastic()
    assert machine.needs_free_devices(state, 20.0, _util(0.95))
    state, actions = _tick(state, 20.0, _util(0.95), free=2)
    reason = ("2 -> 4 workers: utilization 0.95 >= 0.90 over 10 s; trying it against 16.0 "
              "samples/s on 2")
    assert actions == [RequestWorkers("save_exit", 1), Transition(JobStatus.RESIZING, reason),
                       Say(f"resizing {reason}")]
    assert state.resize_target == 4 and state.hang_timeout_s == 120.0  # doubled while saving
    state, _ = _feed(state, WorkerNote("checkpoint", 0, 9), ResizeAcknowledged(1), now=21.0)
    state, actions = _feed(state, WorkersExited(0), now=21.0)
    assert actions == [Resize(2, 4)] and state.phase == "reshaping"
    state, actions = _feed(state, Resized(4), now=21.0)
    assert actions == [
        RecordEvent("resized", "2 -> 4 workers from the checkpoint at step 9; each rank "
                    "accumulates 1 micro-batch(es) per step"),
        NewLogRun("resized 2 -> 4 workers"), StartWorkers(4, 2),
        Transition(JobStatus.RUNNING, "4 worker(s) on c (run 2)", {"world_size": 4})]
    assert state.workers == 4 and state.resize_target is None


def test_low_utilization_shrinks_and_the_exit_note_alone_counts_as_the_answer() -> None:
    state = _elastic()
    assert not machine.needs_free_devices(state, 20.0, _util(0.1))  # shrinking asks no pool
    state, actions = _tick(state, 20.0, _util(0.1))
    assert Transition(JobStatus.RESIZING, "2 -> 1 workers: utilization 0.10 <= 0.20 over 10 s; "
                      "trying it against 16.0 samples/s on 2") in actions
    state, actions = _feed(state, WorkerNote("exit_for_resize", 0), WorkersExited(0), now=22.0)
    assert actions == [Resize(2, 1)]
    state, actions = _feed(state, Resized(1), now=22.0)
    assert RecordEvent("resized", "2 -> 1 workers from the checkpoint at step None; each rank "
                       "accumulates 4 micro-batch(es) per step") in actions


def test_an_acknowledgement_of_an_older_request_is_not_an_exit_for_resize() -> None:
    state, _ = _tick(_elastic(), 20.0, _util(0.1))
    state, actions = _feed(state, ResizeAcknowledged(0), WorkersExited(0), now=21.0)
    assert actions == [Finish(0)] and _final(state)[0] == JobStatus.SUCCEEDED


def test_a_resize_is_refused_without_a_checkpointer_once_per_kind_of_refusal() -> None:
    state = _elastic(checkpointer=False)
    state, actions = _tick(state, 20.0, _util(0.95), free=2)
    assert actions == [RecordEvent("scale_blocked", "would resize 2 -> 4 (utilization 0.95 >= "
                                   "0.90 over 10 s), but the script has no gpufleet.train."
                                   "Checkpointer: a resize would lose its progress")]
    state, actions = _tick(state, 21.5, _util(0.97, until=21), free=2)
    assert actions == [] and state.resize_target is None  # same refusal, other figures


def test_growing_is_blocked_when_the_pool_has_no_free_device() -> None:
    state, actions = _tick(_elastic(), 20.0, _util(0.95), free=0)
    assert actions == [RecordEvent("scale_blocked", "utilization 0.95 >= 0.90 over 10 s, but "
                                   "the pool has 0 free device(s) and growing to 4 needs 2")]
    assert state.resize_target is None


def test_no_decision_within_the_cooldown_or_more_than_once_a_second() -> None:
    state, actions = _tick(_elastic(), 5.0, _util(0.95, until=5), free=2)
    assert actions == []  # cooling down
    state, _ = _tick(state, 20.0, _util(0.1))
    assert state.resize_target == 1
    assert not machine.needs_free_devices(state, 20.5, _util(0.95))


def test_a_resize_the_workers_never_save_for_is_abandoned_at_its_deadline() -> None:
    state, _ = _tick(_elastic(), 20.0, _util(0.95), free=2)
    state, actions = _tick(state, 140.0, ())  # deadline: 20 + 2 x 60 s
    assert actions == []
    state, actions = _tick(state, 141.0, ())
    assert actions == [RecordEvent("scale_blocked", "resize to 4 abandoned: the workers did not "
                                   "save within 120 s"), RequestWorkers("none", 2),
                       Transition(JobStatus.RUNNING, "resize abandoned")]
    assert state.resize_target is None and state.hang_timeout_s == 60.0


def test_a_resize_the_pool_cannot_give_stays_at_the_old_size() -> None:
    state, _ = _tick(_elastic(), 20.0, _util(0.95), free=2)
    state, _ = _feed(state, WorkerNote("exit_for_resize", 1), WorkersExited(0), now=21.0)
    state, actions = _feed(state, Resized(2, blocked="no free cpu device"), now=21.0)
    assert actions[:2] == [
        RecordEvent("scale_blocked", "2 -> 4 workers: no free cpu device; staying at 2"),
        RecordEvent("resized", "2 -> 2 workers from the checkpoint at step None; each rank "
                    "accumulates 2 micro-batch(es) per step")]
    assert StartWorkers(2, 2) in actions


def test_a_failure_ends_a_pending_resize() -> None:
    state, _ = _tick(_elastic(), 20.0, _util(0.95), free=2)
    state, actions = _feed(state, BOOM, now=21.0)
    assert state.resize_target is None and state.resize_deadline is None
    assert isinstance(actions[-1], Wait)


# -- stops -------------------------------------------------------------------------------------

def test_a_stop_while_running_ends_the_workers_and_reads_as_gpufleet_stop_asked() -> None:
    state, actions = _feed(_running(), StopRequested(SIGTERM_REASON))
    assert actions == [EndWorkers(10.0), Finish(None)]
    assert _final(state, asked=STOP_REQUESTED) == (JobStatus.STOPPED, STOP_REQUESTED)
    assert _final(state, asked="something else") == (JobStatus.STOPPED, SIGTERM_REASON)
    state, _ = _feed(state, StopRequested("later"))
    assert state.stop_reason == SIGTERM_REASON  # the first reason stays


def test_a_stop_during_a_resize_is_a_stop_even_if_the_workers_exited_0_to_be_resized() -> None:
    state, _ = _tick(_elastic(), 20.0, _util(0.95), free=2)
    stopped, actions = _feed(state, StopRequested(SIGTERM_REASON), now=21.0)
    assert actions == [EndWorkers(10.0), Finish(None)]
    assert _final(stopped) == (JobStatus.STOPPED, SIGTERM_REASON)
    # the workers left for the resize, then the stop came in: stopped, not succeeded
    state, _ = _feed(state, WorkerNote("exit_for_resize", 0), WorkersExited(0), now=21.0)
    state, actions = _feed(state, StopRequested(SIGTERM_REASON), now=21.0)
    assert actions == [Finish(0)]
    assert _final(state) == (JobStatus.STOPPED, SIGTERM_REASON)


def test_a_stop_during_the_backoff_starts_nothing_and_is_a_stop() -> None:
    state, _ = _feed(_running(max_restarts=10), WorkersExited(1), BackoffOver(), WorkersExited(1))
    assert state.phase == "backoff"
    state, actions = _feed(state, StopRequested(SIGTERM_REASON))
    assert actions == [Finish(1)]
    assert _final(state) == (JobStatus.STOPPED, SIGTERM_REASON)


def test_a_stop_that_came_before_the_start_is_recorded_as_gpufleet_stop() -> None:
    state, actions = _feed(machine.initial(_config(), 2), StopRequested(STOP_REQUESTED))
    assert actions == [] and state.runs == 0
    assert _final(state, asked=STOP_REQUESTED) == (JobStatus.STOPPED, STOP_REQUESTED)
    assert _feed(state, StopRequested("x"), Tick(), WorkersExited(0))[1] == []


def test_a_stop_after_restarts_ran_out_is_still_a_stop() -> None:
    state, _ = _feed(_running(max_restarts=0), Reported(0, 1), Tick(), now=0.0)
    state, _ = _feed(state, Tick(), now=100.0)  # a hang, restarts off: final failure
    assert state.final_failure is not None
    state, _ = _feed(state, StopRequested(SIGTERM_REASON))  # arrives during the clean-up
    assert _final(state) == (JobStatus.STOPPED, SIGTERM_REASON)


def test_ctrl_c_and_a_supervisor_error() -> None:
    state, actions = _feed(_running(), Interrupted())
    assert actions == [Finish(None)] and state.interrupted
    assert _final(state) == (JobStatus.STOPPED, "interrupted by user (Ctrl-C)")
    state, _ = _feed(_running(), WorkersExited(1), SupervisorFailed("supervisor error: OSError: x"))
    assert state.exit_code is None
    assert _final(state, asked=STOP_REQUESTED) == (JobStatus.FAILED, "supervisor error: OSError: x")
    state, _ = _feed(state, StopRequested(SIGTERM_REASON))
    assert _final(state)[0] == JobStatus.FAILED  # the supervisor's error comes first


# -- node loss (an engine that heals) ----------------------------------------------------------

def test_a_lost_node_is_healed_before_the_restart_and_the_size_follows_the_cluster() -> None:
    state, actions = _feed(machine.initial(_config(heals=True), 2), Begin(), WorkersStarted())
    assert actions == [StartWorkers(2, 1)]  # the first run needs no heal
    lost = WorkersExited(75, error="NodeLostError: node worker1 left", last_lines="a\nb",
                         node_lost=True)
    state, actions = _feed(state, lost)
    assert RecordEvent("worker_failed", "a worker failed (exit code 75): NodeLostError: node "
                       "worker1 left\nlast lines:\na\nb") in actions
    state, actions = _feed(state, BackoffOver())
    assert actions == [NewLogRun("restart 1: a worker failed (exit code 75): NodeLostError: "
                                 "node worker1 left"), Heal()]
    assert state.phase == "healing"
    state, actions = _feed(state, Healed(1, ("node worker1 lost; going on with 1 node",)))
    note = "node worker1 lost; going on with 1 node"
    assert actions == [RecordEvent("node_replaced", note), Say(note), StartWorkers(1, 2),
                       Transition(JobStatus.RUNNING, "1 worker(s) on c (run 2)", {"world_size": 1})]


def test_a_lost_nodes_restart_names_the_checkpoint_its_replacement_can_read() -> None:
    state = _running(heals=True, durable=True)
    state, _ = _feed(state, WorkerNote("checkpointer", 0), WorkerNote("checkpoint", 0, 8),
                     WorkerNote("checkpoint_copied", 0, 8), WorkerNote("checkpoint", 0, 10),
                     Reported(0, 11))
    _, actions = _feed(state, WorkersExited(75, error="NodeLostError: node worker1 left",
                                            node_lost=True))
    said = next(a.reason for a in actions if isinstance(a, Transition))
    assert said.endswith("restart 1 of 3 now, from gpufleet's checkpoint at step 8, the newest "
                         "copied to --checkpoint-to (a newer one only if every node still has "
                         "it); up to 3 step(s) are redone"), said
    # a rank that failed on a node still there resumes from the newest save, as ever
    _, actions = _feed(state, WorkersExited(1, rank=0, rank_code=1))
    said = next(a.reason for a in actions if isinstance(a, Transition))
    assert said.endswith("from gpufleet's checkpoint at step 10; 1 step(s) are redone"), said


def test_a_resumed_job_starts_knowing_its_durable_copy() -> None:
    state, _ = _feed(machine.initial(_config(heals=True, durable=True), 2, 30, copied_step=30),
                     Begin(), WorkersStarted(), WorkerNote("resumed", 0, 30), Reported(0, 34))
    _, actions = _feed(state, WorkersExited(75, node_lost=True))
    said = next(a.reason for a in actions if isinstance(a, Transition))
    assert "from gpufleet's checkpoint at step 30, the newest copied to --checkpoint-to; up to 4 " \
        "step(s) are redone" in said, said


def test_a_stop_while_healing_starts_nothing() -> None:
    state, _ = _feed(machine.initial(_config(heals=True), 2), Begin(), WorkersExited(75),
                     BackoffOver())
    state, actions = _feed(state, StopRequested(SIGTERM_REASON), Healed(2))
    assert actions == [Finish(75)] and state.phase == "done"
    assert _final(state) == (JobStatus.STOPPED, SIGTERM_REASON)


def test_a_job_shrinks_then_grows_back_as_its_load_changes() -> None:
    """The shrink keeps its speed on half the workers (kept); growing waits out the hold-off
    the verdict set, then the utilization grows the job again."""
    policy = elastic.Policy(1, 2, scale_up_util=0.45, scale_down_util=0.2, cooldown_s=3.0)
    state = _running(policy=policy, allowed=(1, 2))
    state, _ = _feed(state, WorkerNote("checkpointer", 0), Reported(0, 1), Reported(1, 1), now=0.0)
    state, actions = _tick(state, 5.0, tuple((float(t), 0.03) for t in range(6)))
    assert RequestWorkers("save_exit", 1) in actions
    state, _ = _feed(state, WorkerNote("exit_for_resize", 0), WorkersExited(0), Resized(1),
                     WorkersStarted(), now=6.0)
    assert state.workers == 1 and state.training_since is None
    state, _ = _feed(state, Reported(0, 14), now=7.0)
    state, actions = _tick(state, 13.0, (), progress=_marks(13.0, start=7.0))
    assert RecordEvent("resize_kept", "throughput held after 2 -> 1 (16.0 -> 16.0 samples/s; "
                       "per worker +100%); kept 1; no growing for 5m") in actions
    busy = tuple((float(t), 0.75) for t in range(10, 15))
    assert not machine.needs_free_devices(state, 14.0, busy)  # on hold
    state, actions = _tick(state, 14.0, busy, free=1, progress=_marks(14.0, start=7.0))
    assert actions == []
    later = 13.0 + 300.0
    busy = tuple((later - 5 + t, 0.75) for t in range(6))
    assert machine.needs_free_devices(state, later, busy)
    state, actions = _tick(state, later, busy, free=1, progress=_marks(later, start=7.0))
    reason = "1 -> 2 workers: utilization 0.75 >= 0.45 over 3 s; trying it against 16.0 samples/s on 1"
    assert actions == [RequestWorkers("save_exit", 2), Transition(JobStatus.RESIZING, reason),
                       Say(f"resizing {reason}")]


# -- the time limit --------------------------------------------------------------------------------

def test_the_time_limit_counts_from_the_first_start_and_ends_the_job_as_stopped() -> None:
    state, _ = _feed(machine.initial(_config(time_limit_s=600.0), 2), Begin(), WorkersStarted(),
                     now=100.0)
    state, actions = _feed(state, Tick((), {}, None), now=699.0)
    assert actions == [] and state.phase == "running"
    state, _ = _feed(state, BOOM, now=650.0)  # a restart does not reset the clock
    state, _ = _feed(state, BackoffOver(), WorkersStarted(), now=660.0)
    assert state.first_started_at == 100.0
    state, actions = _feed(state, Tick((), {}, None), now=700.5)
    assert actions == [EndWorkers(10.0), Finish(None)]
    status, reason = _final(state)
    assert status == JobStatus.STOPPED and reason.startswith("ran past its time limit (10m)")


def test_without_a_time_limit_the_clock_never_stops_a_job() -> None:
    state, actions = _feed(_running(), Tick((), {}, None), now=10.0 ** 7)
    assert actions == [] and state.phase == "running"
