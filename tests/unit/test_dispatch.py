"""One queue pass against a real SQLite store, without starting a supervisor: what the pass
reads (running jobs, recent use, free devices), why the jobs it cannot start wait, and how a
start that loses a race (a cancel, devices taken) or fails leaves the store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.lifecycle import accounts, clusters, dispatch, jobs, pools, queued
from gpufleet.lifecycle.accounts import Identity
from gpufleet.sched.model import Running, Wait
from gpufleet.sched.order import Use, recent_gpu_hours
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.status import JobStatus, QueueStatus
from gpufleet.store import Cluster, Job, QueuedJob, Reservation, Store, gpufleet_home

ADMIN = Identity("root", None, True)
ANA = Identity("ana", "vision", False)
SLOTS = 2


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFLEET_TELEMETRY", "0")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hello')\n")
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def spec(name: str, count: int = 1, cluster: str | None = None, **fields: object) -> JobSpec:
    where: object = cluster if cluster else {"gpu": "cpu", "count": count}
    return JobSpec.parse({"script": "train.py", "name": name, "cluster": where, **fields})


def submit(store: Store, s: JobSpec, who: Identity = ANA) -> tuple[Job, Cluster] | QueuedJob:
    return queued.run_or_queue(store, s, who, lambda _offer: None, SLOTS)


def started(store: Store, s: JobSpec, who: Identity = ANA) -> Job:
    """A job started at once and running, as its supervisor would record it (none runs)."""
    got = submit(store, s, who)
    assert isinstance(got, tuple)
    assert jobs.transition(store, got[0].id, JobStatus.RUNNING, expect=(JobStatus.STARTING,))
    return jobs.get(store, got[0].name)


def hold(store: Store, count: int = SLOTS, name: str = "hold") -> Cluster:
    nodes = pools.backend_for(None, SLOTS).discover()
    return clusters.launch(store, ClusterSpec.parse({"gpu": "cpu", "count": count, "name": name}),
                           nodes)


def test_an_empty_queue_is_a_pass_that_does_nothing(store: Store) -> None:
    done = dispatch.dispatch(store)
    assert (done.plan.starts, done.plan.held, done.started, done.refused) == ((), (), [], {})


def test_running_now_is_every_active_job_with_its_devices_and_end(store: Store) -> None:
    own = started(store, spec("own", 1, time_limit="1h"))
    hold(store, 1)
    shared = started(store, spec("shared", cluster="hold"), Identity("bo", None, False))
    assert own.started_at is not None and shared.started_at is not None
    got = sorted(dispatch.running_now(store), key=lambda r: r.name)
    assert got == [Running("own", "ana", "vision", ("local", "cpu"), 1, own.started_at,
                           own.started_at + 3600.0, None),
                   Running("shared", "bo", None, ("local", "cpu"), 1, shared.started_at, None,
                           "hold")]
    jobs.transition(store, own.id, JobStatus.SUCCEEDED)
    assert [r.name for r in dispatch.running_now(store)] == ["shared"]


def test_recent_use_weighs_each_users_device_hours(store: Store) -> None:
    now = time.time()
    a = started(store, spec("a", 2))
    with store.session() as s:
        j = s.get(Job, a.id)
        assert j is not None
        j.started_at, j.ended_at, j.status = now - 7200.0, now - 3600.0, JobStatus.SUCCEEDED
    with store.session() as s:  # one that never started counts nothing
        s.add(Job(name="never", cluster_id=a.cluster_id, status=JobStatus.FAILED, spec_json="{}",
                  job_dir="/nonexistent", world_size=1, created_at=now - 60.0, ended_at=now,
                  samples=0, user="cy"))
    got = dispatch.recent_use(store, now)
    assert got == pytest.approx(recent_gpu_hours([Use("ana", 2, now - 7200.0, now - 3600.0)],
                                                 now))
    assert 1.9 < got["ana"] < 2.0  # two device-hours, an hour old, decayed a little
    far = now + dispatch.USE_WINDOW_S + 10.0
    assert dispatch.recent_use(store, far) == {}  # ended before the window


def test_inventory_counts_free_devices_of_a_type_beside_reservations(store: Store) -> None:
    assert dispatch.Inventory(store).free("local", "cpu", 4) == 4
    hold(store, 1)
    inv = dispatch.Inventory(store)
    assert inv.free("local", "cpu", 4) == 3
    assert inv.free("local", "cpu", SLOTS) == 1  # each slot count is its own view of the host
    assert inv.free("local", "H100-SXM", 4) == 0


def test_a_pass_that_starts_nothing_records_why_each_job_waits(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    accounts.set_quota(store, ADMIN, "vision", "cpu", 2)
    runner = started(store, spec("runner", 2, time_limit="1h"))
    assert runner.started_at is not None
    for name, count, limit in (("head", 2, "30m"), ("next", 1, "10m"), ("over", 1, None)):
        assert isinstance(submit(store, spec(name, count, time_limit=limit)), QueuedJob)
    with store.session() as s:  # bo's two jobs, no team: the quota is not theirs
        for e in s.scalars(select(QueuedJob).where(QueuedJob.name.in_(("head", "next")))):
            e.user, e.team = "bo", None
    now = time.time()
    done = dispatch.dispatch(store, now)
    assert done.started == [] and done.refused == {}
    got = {e.name: (e.wait, e.position, e.est_start, e.decided_at, e.status)
           for e in queued.waiting(store)}
    shadow = runner.started_at + 3600.0
    assert got["head"] == (Wait.DEVICES, 1, pytest.approx(shadow), now, QueueStatus.QUEUED)
    assert got["next"] == (Wait.BEHIND, 2, pytest.approx(shadow + 1800.0), now,
                           QueueStatus.QUEUED)
    assert got["over"][:3] == (Wait.QUOTA, 3, None)
    reasons = {e.name: e.reason for e in queued.waiting(store)}
    assert reasons["head"] == "waits for 2 CPU slots to be free (0 free now)"
    assert reasons["next"] == "behind the job at position 1, which is next for cpu devices"
    assert reasons["over"] is not None and "team vision's quota is 2 CPU slots" in reasons["over"]


def test_a_start_that_finds_its_entry_cancelled_does_nothing(store: Store) -> None:
    hold(store)
    e = submit(store, spec("late", 1))
    assert isinstance(e, QueuedJob)
    clusters.stop(store, "hold")
    queued.cancel(store, "late", ANA)  # between the pass reading the queue and its start
    assert dispatch._start(store, e, spec("late", 1), False, time.time()) == ""
    assert jobs.get_or_none(store, "late") is None
    assert queued.entry(store, "late").status == QueueStatus.CANCELLED  # type: ignore[union-attr]


def test_a_start_whose_devices_went_a_moment_ago_stays_queued(store: Store) -> None:
    hold(store)
    e = submit(store, spec("w", 1))
    assert isinstance(e, QueuedJob)
    assert dispatch._start(store, e, spec("w", 1), False, time.time()) == ""
    again = queued.entry(store, "w")
    assert again is not None and (again.status, again.left_at) == (QueueStatus.QUEUED, None)
    assert jobs.get_or_none(store, "w") is None


def test_a_start_that_can_never_happen_leaves_the_queue_refused(store: Store) -> None:
    hold(store, 1)
    started(store, spec("a", cluster="hold"))
    e = submit(store, spec("b", cluster="hold"))
    assert isinstance(e, QueuedJob)
    with store.session() as s:  # its cluster was stopped while it waited
        j = s.scalar(select(Job).where(Job.name == "a"))
        assert j is not None
        j.status = JobStatus.SUCCEEDED
    clusters.stop(store, "hold")
    done = dispatch.dispatch(store)
    assert done.started == [] and "is stopped; launch a new one" in done.refused["b"]
    got = queued.entry(store, "b")
    assert got is not None and got.status == QueueStatus.REFUSED and got.left_at is not None
    assert accounts.audit_log(store)[0]["action"] == "refuse"


def test_a_supervisor_that_cannot_start_fails_the_job_and_frees_its_devices(
        store: Store) -> None:
    hold(store)
    assert isinstance(submit(store, spec("j", 2)), QueuedJob)
    clusters.stop(store, "hold")
    log = gpufleet_home() / "jobs" / "j" / "supervisor.log"
    log.mkdir(parents=True)  # the supervisor's log cannot be opened: nothing is started
    done = dispatch.dispatch(store)
    assert done.started == [] and "its supervisor could not start" in done.refused["j"]
    job = jobs.get(store, "j")
    assert job.status == JobStatus.FAILED and job.reason == done.refused["j"]
    with store.read() as s:
        assert list(s.scalars(select(Reservation))) == []
    assert queued.entry(store, "j").status == QueueStatus.STARTED  # type: ignore[union-attr]


def test_a_pool_that_cannot_be_seen_holds_up_only_its_own_jobs(store: Store) -> None:
    hold(store)
    assert isinstance(submit(store, spec("here", 1)), QueuedJob)
    with store.session() as s:  # waiting on a pool that was removed since
        s.add(QueuedJob(name="there", user="ana", team=None, priority=0, submitted_at=1.0,
                        spec_json=spec("there", 1).model_dump_json(), pool="gone", gpu="cpu",
                        count=1, status=QueueStatus.QUEUED))
    done = dispatch.dispatch(store)
    assert done.started == [] and done.refused == {}
    reasons = {e.name: e.reason for e in queued.waiting(store)}
    assert reasons["here"] == "waits for 1 CPU slot to be free (0 free now)"
    assert reasons["there"] is not None
    assert reasons["there"].startswith("pool gone cannot be used now: pool: no pool named 'gone'")


def test_a_limit_lowered_under_a_queued_job_refuses_it_with_the_reason(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    hold(store)
    waiting = submit(store, spec("wide", 2))
    assert isinstance(waiting, QueuedJob)
    accounts.set_quota(store, ADMIN, "vision", "cpu", 1)  # now it can never be admitted
    done = dispatch.dispatch(store)
    assert done.started == []
    gone = queued.entry(store, "wide")
    assert gone is not None and gone.status == QueueStatus.REFUSED
    assert gone.reason is not None and gone.reason.startswith("it can no longer start: ")
    assert "quota is 1 at once" in gone.reason and gone.env_json is None


def test_entries_a_dead_server_claimed_but_never_started_are_queued_again(store: Store) -> None:
    hold(store)
    for name in ("claimed", "running"):
        assert isinstance(submit(store, spec(name)), QueuedJob)
    with store.session() as s:
        for e in s.scalars(select(QueuedJob)):
            e.status = QueueStatus.STARTED
    with store.session() as s:  # "running" got its job record before the server died
        c = s.scalar(select(Cluster).where(Cluster.name == "hold"))
        assert c is not None
        s.add(Job(name="running", cluster_id=c.id, status="running", spec_json="{}",
                  job_dir="/x", world_size=1, created_at=0.0, samples=0))
    assert dispatch.requeue_unstarted(store) == ["claimed"]
    assert [e.name for e in queued.waiting(store)] == ["claimed"]


def test_an_idle_cluster_a_member_launched_counts_for_the_team(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    nodes = pools.backend_for(None, SLOTS).discover()
    clusters.launch(store, ClusterSpec.parse({"gpu": "cpu", "count": 1, "name": "mine"}), nodes,
                    user="ana")
    clusters.launch(store, ClusterSpec.parse({"gpu": "cpu", "count": 1, "name": "root"}), nodes)
    idle = [r for r in dispatch.running_now(store) if r.name.startswith("cluster ")]
    assert [(r.name, r.team, r.count, r.ends_by) for r in idle] == [("cluster mine", "vision", 1,
                                                                     None)]
    from gpufleet.lifecycle import teams

    assert teams.in_use(store) == {("vision", "cpu"): 1}
