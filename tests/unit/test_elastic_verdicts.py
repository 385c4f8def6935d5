"""The supervisor's machine judging its resizes by goodput: issue 27's shrink reverted and held
off, a kept shrink that does not flap, growing back when the devices are free (and not when they
are not), and the trials a blocked, abandoned or failed resize leaves behind."""

from __future__ import annotations

from gpufleet.status import JobStatus
from gpufleet.supervise import elastic, machine
from gpufleet.supervise.events import (
    Action,
    Begin,
    Event,
    RecordEvent,
    Reported,
    RequestWorkers,
    Resize,
    Resized,
    Say,
    StartWorkers,
    Tick,
    Transition,
    WorkerNote,
    WorkersExited,
    WorkersStarted,
)
from gpufleet.supervise.goodput import Mark
from gpufleet.supervise.machine import Config, State

POLICY = elastic.Policy(1, 2, scale_up_util=0.9, scale_down_util=0.5, cooldown_s=15.0)
RATE = 0.0446  # $/device-hour
BATCH = 160


def _feed(state: State, *events: Event, now: float) -> tuple[State, list[Action]]:
    actions: list[Action] = []
    for event in events:
        state, more = machine.step(state, event, now)
        actions += more
    return state, actions


def _started(workers: int = 2) -> State:
    """Training since t=0 with a Checkpointer."""
    config = Config(cluster_name="c", max_restarts=3, hang_timeout_s=60.0, policy=POLICY,
                    allowed=(1, 2), usd_per_device_hour=RATE)
    state, _ = _feed(machine.initial(config, workers), Begin(), WorkersStarted(),
                     WorkerNote("checkpointer", 0), Reported(0, 1), now=0.0)
    return state


def _marks(samples_per_s: float, start: float, end: float) -> tuple[Mark, ...]:
    """Rank 0's reports of `BATCH`-sample steps at `samples_per_s`, from `start` to `end`."""
    dt = BATCH / samples_per_s
    return tuple(Mark(start + i * dt, i, i * BATCH) for i in range(int((end - start) / dt) + 1))


def _tick(state: State, now: float, util: float, progress: tuple[Mark, ...],
          free: int | None = None) -> tuple[State, list[Action]]:
    state, _ = _feed(state, Reported(0, 1), now=now)  # alive
    samples = tuple((now - 20 + t, util) for t in range(21))
    return _feed(state, Tick(samples, free=free, progress=progress), now=now)


def _resize_done(state: State, workers: int, now: float) -> State:
    """The workers save and exit, the reservation changes, the new run trains from `now`."""
    state, actions = _feed(state, WorkerNote("exit_for_resize", 0), WorkersExited(0), now=now)
    assert isinstance(actions[0], Resize)
    state, actions = _feed(state, Resized(workers), WorkersStarted(), Reported(0, 1), now=now)
    assert StartWorkers(workers, state.runs) in actions
    return state


def _shrunk(after_rate: float) -> tuple[State, list[Action]]:
    """Issue 27's trial: 413 samples/s on 2, utilization 0.42 -> 1 worker at `after_rate` from
    t=35; judged at t=66 (after window 50-65 s: the cooldown, then 15 s)."""
    state, actions = _tick(_started(), 20.0, 0.42, _marks(413.0, 0.0, 20.0))
    reason = ("2 -> 1 workers: utilization 0.42 <= 0.50 over 15 s; trying it against 413 "
              "samples/s (16.7M samples per $) on 2")
    assert actions == [RequestWorkers("save_exit", 1), Transition(JobStatus.RESIZING, reason),
                       Say(f"resizing {reason}")]
    state = _resize_done(state, 1, 35.0)
    state, actions = _tick(state, 64.0, 0.2, _marks(after_rate, 35.0, 64.0))
    assert actions == [] and state.trial is not None  # the after window is not over yet
    return _tick(state, 66.0, 0.2, _marks(after_rate, 35.0, 66.0))


def test_the_trials_shrink_is_reverted_and_shrinking_held_off() -> None:
    state, actions = _shrunk(74.0)
    text = ("throughput fell 82% after 2 -> 1 (413 -> 74.0 samples/s; samples per $ 16.7M -> "
            "5.97M, -64%, more than the 10% tolerance); reverted to 2; no shrinking for 5m")
    back = "1 -> 2 workers: reverting (throughput fell 82%, samples per $ -64%)"
    assert actions == [RecordEvent("resize_reverted", text), Say(text),
                       RequestWorkers("save_exit", 2), Transition(JobStatus.RESIZING, back),
                       Say(f"resizing {back}")]
    assert state.trial is None and len(state.judged) == 1
    state = _resize_done(state, 2, 80.0)
    assert state.trial is None  # a revert is not judged again
    for now in (100.0, 200.0, 365.0):  # still 0.42: shrinking waits out the hold-off
        state, actions = _tick(state, now, 0.42, _marks(413.0, 80.0, now))
        assert actions == [], now
    state, actions = _tick(state, 367.0, 0.42, _marks(413.0, 80.0, 367.0))
    assert RequestWorkers("save_exit", 3) in actions  # tried again
    state = _resize_done(state, 1, 380.0)
    state, actions = _tick(state, 411.0, 0.2, _marks(74.0, 380.0, 411.0))
    assert any(isinstance(a, RecordEvent) and a.kind == "resize_reverted"
               and a.text.endswith("no shrinking for 10m") for a in actions)


def test_a_kept_shrink_holds_growing_off_and_does_not_flap() -> None:
    state, actions = _shrunk(400.0)
    assert [a for a in actions if isinstance(a, RecordEvent)] == [RecordEvent(
        "resize_kept", "throughput fell 3% after 2 -> 1 (413 -> 400 samples/s; samples per $ "
        "16.7M -> 32.3M, +94%); kept 1; no growing for 5m")]
    assert not any(isinstance(a, RequestWorkers) for a in actions)
    busy = 0.95  # the one worker is busy now: growing would be tried, but it is on hold
    assert not machine.needs_free_devices(state, 100.0, ())
    state, actions = _tick(state, 100.0, busy, _marks(400.0, 35.0, 100.0), free=1)
    assert actions == []


def test_it_grows_back_when_the_devices_are_free_whatever_the_utilization() -> None:
    state, _ = _shrunk(400.0)
    now = 66.0 + 301.0  # the hold-off is over; 0.3 never reaches --scale-up-util
    progress = _marks(400.0, 35.0, now)
    samples = tuple((now - 20 + t, 0.3) for t in range(21))
    assert machine.needs_free_devices(state, now, samples)
    state, actions = _tick(state, now, 0.3, progress, free=1)
    reason = ("1 -> 2 workers: growing back toward 2, the size it ran at before; trying it "
              "against 400 samples/s (32.3M samples per $) on 1")
    assert actions == [RequestWorkers("save_exit", 2), Transition(JobStatus.RESIZING, reason),
                       Say(f"resizing {reason}")]
    assert state.trial is not None  # judged by goodput like any other resize


def test_it_does_not_grow_back_when_the_devices_are_not_free() -> None:
    state, _ = _shrunk(400.0)
    now = 66.0 + 301.0
    state, actions = _tick(state, now, 0.3, _marks(400.0, 35.0, now), free=0)
    assert actions == [RecordEvent("scale_blocked", "growing back toward 2, the size it ran at "
                                   "before, but the pool has 0 free device(s) and growing to 2 "
                                   "needs 1")]
    state, actions = _tick(state, now + 1, 0.3, _marks(400.0, 35.0, now + 1), free=0)
    assert actions == [] and state.resize_target is None  # said once


def test_a_resize_the_pool_refuses_leaves_nothing_to_judge() -> None:
    state, _ = _tick(_started(), 20.0, 0.42, _marks(413.0, 0.0, 20.0))
    state, _ = _feed(state, WorkerNote("exit_for_resize", 0), WorkersExited(0), now=21.0)
    state, _ = _feed(state, Resized(2, blocked="no"), WorkersStarted(), Reported(0, 1), now=21.0)
    assert state.trial is None and state.workers == 2


def test_an_abandoned_resize_leaves_nothing_to_judge() -> None:
    state, _ = _tick(_started(), 20.0, 0.42, _marks(413.0, 0.0, 20.0))
    state, actions = _tick(state, 141.0, 0.7, _marks(413.0, 0.0, 141.0))
    assert RequestWorkers("none", 2) in actions and state.trial is None


def test_a_failure_before_the_resize_drops_its_trial_one_after_keeps_it() -> None:
    state, _ = _tick(_started(), 20.0, 0.42, _marks(413.0, 0.0, 20.0))
    failed, _ = _feed(state, WorkersExited(1), now=21.0)
    assert failed.trial is None
    state = _resize_done(state, 1, 35.0)
    failed, _ = _feed(state, WorkersExited(1), now=40.0)
    assert failed.trial is not None  # the restart at 1 is judged once it settles
