"""`--after`, `hold`/`release`, the whole queue as a user sees it, and refusals in the audit
trail, on a real SQLite store and this host's CPU slots. No supervisor is started: where a pass
would start a job, its supervisor's log path is a folder, so the start fails with that reason
and says which job the pass chose (`dispatch.Pass.refused`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.errors import ConflictError, ForbiddenError, NotFoundError, SpecError, StateError
from gpufleet.lifecycle import (
    accounts,
    clusters,
    dispatch,
    hold_release,
    jobs,
    listing,
    pools,
    queued,
)
from gpufleet.lifecycle.accounts import Identity
from gpufleet.sched import after
from gpufleet.sched.model import Wait
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.status import JOB_ACTIVE, JobStatus, QueueStatus
from gpufleet.store import Cluster, Job, QueuedJob, Store, gpufleet_home

ADMIN = Identity("root", None, True)
ANA = Identity("ana", "vision", False)
BO = Identity("bo", None, False)
SLOTS = 2


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFLEET_TELEMETRY", "0")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hello')\n")  # never run: nothing starts here
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def spec(name: str, count: int = 1, **fields: object) -> JobSpec:
    return JobSpec.parse({"script": "train.py", "name": name,
                          "cluster": {"gpu": "cpu", "count": count}, **fields})


def submit(store: Store, s: JobSpec, who: Identity = ANA,
           queue: bool = True) -> tuple[Job, Cluster] | QueuedJob:
    return queued.run_or_queue(store, s, who, lambda _offer: None, SLOTS, queue=queue)


def started(store: Store, s: JobSpec, who: Identity = ANA) -> Job:
    """A job started at once and running, as its supervisor would record it (none runs)."""
    got = submit(store, s, who)
    assert isinstance(got, tuple)
    assert jobs.transition(store, got[0].id, JobStatus.RUNNING, expect=(JobStatus.STARTING,))
    return jobs.get(store, got[0].name)


def ended(store: Store, name: str, status: JobStatus) -> None:
    """The job's end as its supervisor records it (its devices stay held: no reconcile here)."""
    assert jobs.transition(store, jobs.get(store, name).id, status, "test")


def occupy(store: Store, count: int, name: str = "hold") -> Cluster:
    nodes = pools.backend_for(None, SLOTS).discover()
    return clusters.launch(store, ClusterSpec.parse({"gpu": "cpu", "count": count, "name": name}),
                           nodes)


def unstartable(*names: str) -> None:
    """A start of these jobs fails before any process (their supervisor log is a folder)."""
    for name in names:
        (gpufleet_home() / "jobs" / name / "supervisor.log").mkdir(parents=True)


def entry(store: Store, name: str) -> QueuedJob:
    e = queued.entry(store, name)
    assert e is not None, name
    return e


def test_the_sched_words_are_the_stores_statuses() -> None:
    assert after.SUCCEEDED == JobStatus.SUCCEEDED
    assert {*JOB_ACTIVE, QueueStatus.QUEUED, QueueStatus.STARTED} == after.PENDING


def test_after_names_a_job_of_ones_own_that_can_still_succeed(store: Store) -> None:
    with pytest.raises(SpecError) as unknown:
        submit(store, spec("x", after="nosuch"))
    assert str(unknown.value).startswith("after: no job of yours named 'nosuch'")
    started(store, spec("theirs"), BO)
    with pytest.raises(SpecError) as theirs:  # the same words: bo's job names stay bo's
        submit(store, spec("x", after="theirs"))
    assert str(theirs.value) == str(unknown.value).replace("nosuch", "theirs")
    started(store, spec("broke"))
    ended(store, "broke", JobStatus.FAILED)
    with pytest.raises(SpecError) as failed:
        submit(store, spec("x", after="broke"))
    assert str(failed.value) == (f"after: {after.never('broke', 'failed')}, so this job could "
                                 "never start")
    assert queued.waiting(store) == [] and jobs.get_or_none(store, "x") is None
    assert isinstance(submit(store, spec("y", after="theirs"), ADMIN), QueuedJob)  # an admin's


def test_a_job_after_a_running_one_waits_though_a_device_is_free(store: Store) -> None:
    started(store, spec("first"))
    second = submit(store, spec("second", after="first"))
    assert isinstance(second, QueuedJob) and second.after == "first"
    assert "after first" in accounts.audit_log(store)[0]["detail"]
    assert isinstance(submit(store, spec("other")), tuple)  # it holds up no one: starts at once
    with pytest.raises(ConflictError) as refused:
        submit(store, spec("third", after="first"), queue=False)
    assert str(refused.value) == ("after: job first has not succeeded yet (it is running); "
                                  "without --no-queue this job would wait for it")


def test_a_job_after_one_that_succeeded_starts_at_once(store: Store) -> None:
    started(store, spec("first"))
    ended(store, "first", JobStatus.SUCCEEDED)
    got = submit(store, spec("second", after="first"))
    assert isinstance(got, tuple) and got[0].name == "second"


def test_a_pass_keeps_a_dependent_waiting_then_lets_the_devices_decide(store: Store) -> None:
    started(store, spec("first"))
    assert isinstance(submit(store, spec("second", after="first")), QueuedJob)
    unstartable("second")
    done = dispatch.dispatch(store)
    assert done.started == [] and done.refused == {}  # one slot is free: it is not used
    e = entry(store, "second")
    assert (e.wait, e.position, e.est_start, e.start_note) == (Wait.AFTER, 1, None,
                                                               "after first")
    assert e.reason == "after first: starts once first succeeds (first is running)"
    ended(store, "first", JobStatus.SUCCEEDED)
    occupy(store, 1)  # the free slot is gone meanwhile: now it waits for devices
    dispatch.dispatch(store)
    assert entry(store, "second").wait == Wait.DEVICES


def test_a_failed_link_cancels_the_rest_of_the_chain_with_the_reason(store: Store) -> None:
    started(store, spec("first"))
    for name, dep in (("second", "first"), ("third", "second")):
        assert isinstance(submit(store, spec(name, after=dep)), QueuedJob)
    ended(store, "first", JobStatus.FAILED)
    done = dispatch.dispatch(store)
    why = after.never("first", "failed")
    assert done.cancelled == {"second": why, "third": "job second, which it runs after, can "
                              "never start (it leaves the queue too)"}
    e = entry(store, "second")
    assert (e.status, e.reason) == (QueueStatus.CANCELLED, f"cancelled: {why}")
    assert e.left_at is not None and e.env_json is None
    trail = {(r["user"], r["action"], r["subject"]) for r in accounts.audit_log(store)}
    assert {("gpufleet", "cancel", "second"), ("gpufleet", "cancel", "third")} <= trail
    assert queued.waiting(store) == []


def test_a_held_job_keeps_its_place_but_does_not_start_until_released(store: Store) -> None:
    occupy(store, SLOTS)
    for name in ("early", "late"):
        assert isinstance(submit(store, spec(name)), QueuedJob)
    assert hold_release.hold(store, "early", ANA) is True
    assert hold_release.hold(store, "early", ANA) is False  # held already: nothing changes
    e = entry(store, "early")
    assert (e.held_by, e.wait, e.start_note) == ("ana", Wait.HELD, "held")  # before any pass
    clusters.stop(store, "hold")
    unstartable("early", "late")
    done = dispatch.dispatch(store)
    assert list(done.refused) == ["late"]  # chosen to start; the held one was not
    e = entry(store, "early")
    assert (e.status, e.wait, e.position) == (QueueStatus.QUEUED, Wait.HELD, 1)
    assert hold_release.release(store, "early", ANA) is True
    assert hold_release.release(store, "early", ANA) is False
    assert list(dispatch.dispatch(store).refused) == ["early"]
    trail = [(r["user"], r["action"], r["subject"]) for r in accounts.audit_log(store)]
    assert ("ana", "hold", "early") in trail and ("ana", "release", "early") in trail


def test_who_may_hold_and_release(store: Store) -> None:
    occupy(store, SLOTS)
    assert isinstance(submit(store, spec("mine")), QueuedJob)
    with pytest.raises(ForbiddenError, match="not yours"):
        hold_release.hold(store, "mine", BO)
    assert hold_release.hold(store, "mine", ADMIN)
    with pytest.raises(ForbiddenError) as kept:  # an admin's hold is the admin's to release
        hold_release.release(store, "mine", ANA)
    assert str(kept.value) == ("release: job 'mine' was held by an admin (root); only an admin "
                               "may release it")
    assert hold_release.release(store, "mine", ADMIN)
    with pytest.raises(NotFoundError):
        hold_release.hold(store, "nosuch", ANA)
    queued.cancel(store, "mine", ANA)
    with pytest.raises(ConflictError, match="is cancelled, not queued"):
        hold_release.release(store, "mine", ANA)


def test_a_started_job_cannot_be_held(store: Store) -> None:
    started(store, spec("ran"))
    with pytest.raises(ConflictError) as running:
        hold_release.hold(store, "ran", ANA)
    assert "is not queued (it started)" in str(running.value)


def _queue_of_two_users(store: Store) -> None:
    started(store, spec("ana-run"))
    started(store, spec("bo-run"), BO)
    assert isinstance(submit(store, spec("ana-q", priority=5)), QueuedJob)  # first in order
    assert isinstance(submit(store, spec("bo-q", after="bo-run"), BO), QueuedJob)
    assert isinstance(submit(store, spec("bo-gone"), BO), QueuedJob)
    queued.cancel(store, "bo-gone", BO)
    dispatch.dispatch(store)


def test_a_user_sees_the_whole_queue_with_other_users_job_names_hidden(store: Store) -> None:
    _queue_of_two_users(store)
    rows = listing.table(store, ANA, 0.0, everyone=True)
    assert [(r["name"], r["user"], r["status"]) for r in rows] == [
        ("ana-q", "ana", "queued"), (listing.HIDDEN, "bo", "queued"),
        (listing.HIDDEN, "bo", "running"), ("ana-run", "ana", "running")]
    mine, theirs = rows[0], rows[1]
    assert (mine["hidden"], mine["position"], mine["wait"]) == (False, 1, Wait.DEVICES)
    assert (theirs["hidden"], theirs["position"], theirs["wait"]) == (True, 2, Wait.AFTER)
    assert theirs["reason"] == theirs["start_note"] == "after another job of its user"
    assert (theirs["after"], theirs["cluster"], theirs["cost_usd"]) == (None, None, None)
    assert rows[2]["cluster"] is None and rows[2]["cost_usd"] is None
    assert "bo-" not in repr(rows)  # no name of bo's jobs, anywhere in what ana gets
    assert [r["name"] for r in listing.table(store, ANA, 0.0)] == ["ana-q", "ana-run"]
    only_bo = listing.table(store, ANA, 0.0, user="bo", everyone=True)
    assert [(r["name"], r["status"]) for r in only_bo] == [(listing.HIDDEN, "queued"),
                                                           (listing.HIDDEN, "running")]
    admin = listing.table(store, ADMIN, 0.0, everyone=True)
    assert [r["name"] for r in admin] == ["ana-q", "bo-q", "bo-run", "ana-run", "bo-gone"]
    assert not any(r["hidden"] for r in admin)


def test_a_refusal_is_an_audit_row_with_the_reason(store: Store) -> None:
    occupy(store, SLOTS)
    assert isinstance(submit(store, spec("mine")), QueuedJob)
    audited = accounts.refusals_audited(store, BO, "cancel", "mine")
    with pytest.raises(ForbiddenError) as refused, audited:
        queued.cancel(store, "mine", BO)
    row = accounts.audit_log(store)[0]
    assert (row["user"], row["action"], row["subject"], row["detail"]) == (
        "bo", "cancel_refused", "mine", str(refused.value))
    before = len(accounts.audit_log(store))
    audited = accounts.refusals_audited(store, BO, "cancel", "mine")
    with pytest.raises(StateError), audited:  # the store failing is not a refusal
        raise StateError("state: gone")
    assert len(accounts.audit_log(store)) == before
    with store.read() as s:
        assert len(list(s.scalars(select(QueuedJob)))) == 1
