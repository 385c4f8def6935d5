"""What the supervisor trusts of what reaches its report socket: only datagrams signed with the
job's key (intake), told about once in a while when others arrive (rejected), and a control note
(`exit_for_resize`) only as the answer to a resize the supervisor asked for (machine).

The forgeries are the ones an adversarial trial sent to a job's port: a bare exit_for_resize that
made a non-elastic job train twice, fake progress, a checkpoint at step 1e9, a stranger's pid."""

from __future__ import annotations

import json
from typing import Any

from gpufleet.reportauth import Rejection, Signer, new_key
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Job
from gpufleet.supervise import elastic, machine, outcome, rejected
from gpufleet.supervise.events import (
    Begin,
    Finish,
    RecordEvent,
    Reported,
    Resize,
    Tick,
    WorkerNote,
    WorkersExited,
    WorkersStarted,
)
from gpufleet.supervise.goodput import Mark
from gpufleet.supervise.intake import Intake

KEY = new_key()


def _intake(total_steps: int | None = 10) -> Intake:
    return Intake(Job(name="j", total_steps=total_steps), Cluster(name="c"), KEY)


def _sealed(rec: dict[str, Any], signer: Signer | None = None) -> bytes:
    return (signer or Signer(KEY)).seal(json.dumps(rec).encode())


# -- intake: the signature first ---------------------------------------------------------------

def test_only_signed_datagrams_count_and_the_rest_are_counted_by_reason() -> None:
    intake = _intake()
    forged = [json.dumps({"rank": 0, "event": "exit_for_resize"}).encode(),
              json.dumps({"t": 1.0, "rank": 0, "step": 7, "pid": 1}).encode(),
              Signer(new_key()).seal(json.dumps({"t": 1.0, "rank": 0, "step": 7}).encode())]
    for data in forged:
        assert intake.datagram(data, lambda _pid: True) == []
    assert intake.job.step is None and intake.worker_pids == {}
    good = _sealed({"t": 1.0, "rank": 0, "step": 3, "pid": 4242})
    assert intake.datagram(good, lambda pid: pid == 4242) == [Reported(0, 3)]
    assert intake.datagram(good, lambda _pid: True) == []  # the same datagram again
    assert intake.job.step == 3 and intake.worker_pids == {0: 4242}
    d = intake.dropped
    assert (d.unsigned, d.bad_tag, d.replayed) == (2, 1, 1)


def test_a_signed_report_names_a_pid_only_if_it_is_one_of_the_jobs() -> None:
    intake = _intake()
    intake.datagram(_sealed({"t": 1.0, "rank": 0, "step": 1, "pid": 1}), lambda pid: pid != 1)
    assert intake.worker_pids == {}
    intake.datagram(_sealed({"t": 1.0, "rank": 0, "step": 2, "pid": 77}), lambda pid: pid != 1)
    assert intake.worker_pids == {0: 77}


def test_a_checkpoint_note_past_the_planned_steps_is_dropped() -> None:
    intake = _intake(total_steps=10)
    fake = {"rank": 0, "event": "checkpoint", "step": 10**9, "bytes": 1.0}
    assert intake.datagram(_sealed(fake), lambda _pid: False) == []
    real = intake.datagram(_sealed({**fake, "step": 10}), lambda _pid: False)
    assert real[0] == WorkerNote("checkpoint", 0, 10) and isinstance(real[1], RecordEvent)
    unknown = _intake(total_steps=None)  # no plan known: taken as it comes
    assert unknown.datagram(_sealed(fake), lambda _pid: False)[0] == \
        WorkerNote("checkpoint", 0, 10**9)


# -- rejected: one event, not one per forgery --------------------------------------------------

def test_drops_are_told_at_the_first_then_at_most_every_five_minutes_and_at_the_end() -> None:
    d = rejected.Dropped()
    assert rejected.note(d, 0.0) == (d, None)  # nothing dropped: nothing said
    for _ in range(3):
        d = rejected.count(d, Rejection.UNSIGNED)
    d, first = rejected.note(d, 10.0)
    assert first is not None and first.kind == rejected.KIND
    assert first.text.startswith("3 report datagram(s) dropped (3 so far: 3 unsigned)")
    for _ in range(200):  # the trial's burst
        d = rejected.count(d, Rejection.BAD_TAG)
        d, said = rejected.note(d, 20.0)
        assert said is None
    d, later = rejected.note(d, 10.0 + rejected.NOTE_EVERY_S)
    assert later is not None and later.text.startswith(
        "200 report datagram(s) dropped (203 so far: 3 unsigned, 200 with a bad signature)")
    d = rejected.count(d, Rejection.REPLAYED)
    d, last = rejected.note(d, 11.0 + rejected.NOTE_EVERY_S, final=True)
    assert last is not None and last.text.startswith("1 report datagram(s) dropped (204 so far")
    assert rejected.note(d, 1e9, final=True)[1] is None


# -- machine: a control note only when asked ---------------------------------------------------

def _config(**fields: object) -> machine.Config:
    return machine.Config(cluster_name="c", max_restarts=3, hang_timeout_s=60.0,
                          **fields)  # type: ignore[arg-type]


def _feed(state: machine.State, *events: object, now: float = 0.0) -> tuple[machine.State, list[object]]:
    actions: list[object] = []
    for event in events:
        state, more = machine.step(state, event, now)  # type: ignore[arg-type]
        actions += more
    return state, actions


def test_an_exit_for_resize_nobody_asked_for_is_not_a_resize() -> None:
    """The trial: one note to a non-elastic job made it reshape and train again from scratch."""
    state, _ = _feed(machine.initial(_config(), 2), Begin(), WorkersStarted(), Reported(0, 5))
    state, actions = _feed(state, WorkerNote("exit_for_resize", 0), WorkersExited(0), now=3.0)
    assert actions == [Finish(0)] and state.phase == "done" and state.runs == 1
    assert outcome.final(state.ending, None, "", None)[0] == JobStatus.SUCCEEDED


def test_an_elastic_jobs_exit_for_resize_counts_only_after_its_request_in_this_run() -> None:
    policy = elastic.Policy(1, 2, scale_up_util=0.9, scale_down_util=0.2, cooldown_s=3.0)
    state, _ = _feed(machine.initial(_config(policy=policy, allowed=(1, 2)), 2), Begin(),
                     WorkersStarted(), WorkerNote("checkpointer", 0), Reported(0, 1))
    _, actions = _feed(state, WorkerNote("exit_for_resize", 0), WorkersExited(0), now=1.0)
    assert actions == [Finish(0)]  # before any request: the end, not a resize
    low = tuple((float(t), 0.05) for t in range(6))
    steps = tuple(Mark(float(t), t, 8 * t) for t in range(6))  # what a resize is judged by
    state, _ = _feed(state, Tick(low, progress=steps), now=5.0)
    assert state.exit_asked and state.resize_target == 1
    state, actions = _feed(state, WorkerNote("exit_for_resize", 0), WorkersExited(0), now=6.0)
    assert actions == [Resize(2, 1)]
