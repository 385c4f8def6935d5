"""`run_or_queue` and `cancel` on a real SQLite store and this host's CPU slots: a job starts at
once when it may (as a record and a reservation: the supervisor is the caller's to start), waits
with what it needs when it must, and is refused in one line when it never could run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from gpufleet.errors import AllocationError, ConflictError, ForbiddenError, NotFoundError, SpecError
from gpufleet.lifecycle import accounts, clusters, pools, queued, runs
from gpufleet.lifecycle.accounts import Identity
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.status import JobStatus, QueueStatus
from gpufleet.store import Cluster, Job, QueuedJob, Reservation, Store

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


def submit(store: Store, s: JobSpec, who: Identity = ANA, queue: bool = True,
           slots: int = SLOTS) -> tuple[Job, Cluster] | QueuedJob:
    return queued.run_or_queue(store, s, who, lambda _offer: None, slots, queue=queue)


def hold(store: Store, count: int = SLOTS, name: str = "hold") -> Cluster:
    nodes = pools.backend_for(None, SLOTS).discover()
    return clusters.launch(store, ClusterSpec.parse({"gpu": "cpu", "count": count, "name": name}),
                           nodes)


def reserved(store: Store) -> int:
    with store.read() as s:
        return len(list(s.scalars(select(Reservation))))


def active_clusters(store: Store) -> list[str]:
    with store.read() as s:
        return sorted(s.scalars(select(Cluster.name).where(Cluster.status.in_(clusters.ACTIVE))))


def one_line(exc: pytest.ExceptionInfo[Exception]) -> str:
    text = str(exc.value)
    assert text and "\n" not in text
    return text


def test_a_free_pool_starts_the_job_at_once_and_no_process(store: Store) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    children = len(runs._children)
    got = submit(store, spec("j1", 2, time_limit="1h"))
    assert isinstance(got, tuple)
    job, cluster = got
    assert (job.name, job.status, job.user, job.team) == ("j1", JobStatus.STARTING, "ana",
                                                         "vision")
    assert job.supervisor_pid is None and len(runs._children) == children
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert (cluster.for_job, cluster.count, cluster.gpu) == ("j1", 2, "cpu")
    assert reserved(store) == 2 and queued.waiting(store) == []
    assert accounts.audit_log(store)[0]["detail"] == f"started at once on cluster {cluster.name}"
    ended = runs.stop_job(store, job)  # no supervisor yet: stopped, and its cluster freed
    assert ended.status == JobStatus.STOPPED
    assert reserved(store) == 0 and active_clusters(store) == []


def test_a_held_pool_queues_the_job_with_what_it_needs(store: Store) -> None:
    hold(store)
    got = submit(store, spec("q1", 1, time_limit="90m", priority=5))
    assert isinstance(got, QueuedJob)
    assert (got.status, got.pool, got.gpu, got.count, got.cluster) == (
        QueueStatus.QUEUED, "local", "cpu", 1, None)
    assert (got.time_limit_s, got.priority, got.user, got.team, got.cpu_slots) == (
        5400.0, 5, "ana", "vision", SLOTS)
    rate = clusters.quote_for(ClusterSpec.parse({"gpu": "cpu", "count": 1})).usd_per_hour
    assert got.usd_per_hour == rate > 0
    assert [e.name for e in queued.waiting(store)] == ["q1"]
    assert JobSpec.model_validate_json(got.spec_json).name == "q1"
    assert accounts.audit_log(store)[0]["detail"].startswith("queued: 1 CPU slot on local")
    assert active_clusters(store) == ["hold"]  # nothing reserved for the queued job


def test_without_the_queue_a_busy_pool_or_a_waiting_job_refuses_in_one_line(store: Store) -> None:
    hold(store)
    with pytest.raises(AllocationError) as busy:
        submit(store, spec("now", 1), queue=False)
    assert "cpu" in one_line(busy)
    submit(store, spec("q1", 1))
    clusters.stop(store, "hold")  # free now, but q1 waits for these devices first
    with pytest.raises(ConflictError) as behind:
        submit(store, spec("now", 1), queue=False)
    assert one_line(behind).startswith("queue: jobs are waiting")
    got = submit(store, spec("later", 1))  # with the queue: behind q1, not ahead of it
    assert isinstance(got, QueuedJob)
    assert [e.name for e in queued.waiting(store)] == ["q1", "later"]
    assert active_clusters(store) == []


def test_a_job_that_could_never_fit_is_refused_not_queued(store: Store) -> None:
    for held in (False, True):
        if held:
            hold(store)
        with pytest.raises(SpecError) as exc:  # more CPU slots than this host offers
            submit(store, spec("big", SLOTS + 1))
        assert one_line(exc).startswith(f"count: {SLOTS + 1} CPU slots asked for")
        assert queued.waiting(store) == []
    with pytest.raises(SpecError) as bad:
        submit(store, spec("w", 2, workers_per_node=3))
    assert [f for f, _ in bad.value.problems] == ["workers_per_node"]
    assert queued.waiting(store) == [] and active_clusters(store) == ["hold"]


def team_with_quota(store: Store, devices: int) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    accounts.set_quota(store, ADMIN, "vision", "cpu", devices)


def test_a_team_over_its_quota_waits_though_devices_are_free(store: Store) -> None:
    team_with_quota(store, 2)
    first = submit(store, spec("j1", 2), slots=4)
    assert isinstance(first, tuple)
    got = submit(store, spec("j2", 1), slots=4)
    assert isinstance(got, QueuedJob) and got.team == "vision"
    assert reserved(store) == 2  # j2 took none of the two free slots
    with pytest.raises(ConflictError) as refused:
        submit(store, spec("j3", 1), queue=False, slots=4)
    assert one_line(refused).startswith("limits: team vision's quota is 2 CPU slots at once and 2 "
                                        "are in use")
    with pytest.raises(SpecError) as never:
        submit(store, spec("j4", 3), slots=4)
    assert [f for f, _ in never.value.problems] == ["count"] and "quota is 2" in str(never.value)
    other = submit(store, spec("j5", 1), who=BO, slots=4)  # not of the team: starts
    assert isinstance(other, tuple)
    assert [e.name for e in queued.waiting(store)] == ["j2"]


def test_a_team_whose_budget_is_spent_waits_and_is_refused_without_the_queue(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    accounts.set_budget(store, ADMIN, "vision", 0.0, None, 0.0)
    got = submit(store, spec("j1", 1))
    assert isinstance(got, QueuedJob)
    with pytest.raises(ConflictError) as refused:
        submit(store, spec("j2", 1), queue=False)
    assert "team vision has spent its $0.00 monthly budget" in one_line(refused)
    assert active_clusters(store) == []


def test_a_name_taken_by_a_job_or_a_queue_entry_is_refused(store: Store) -> None:
    started = submit(store, spec("j1", 1))
    assert isinstance(started, tuple)
    hold(store, 1)
    assert isinstance(submit(store, spec("q1", 1)), QueuedJob)
    for name in ("j1", "q1"):
        for queue in (True, False):
            with pytest.raises(ConflictError) as exc:
                submit(store, spec(name, 1), queue=queue)
            assert one_line(exc) == (f"name: a job named '{name}' already exists; pick another "
                                     "name")
    assert sorted(active_clusters(store)) == sorted(["hold", started[1].name])
    assert [e.name for e in queued.waiting(store)] == ["q1"]


def on(name: str, cluster: str = "hold") -> JobSpec:
    return JobSpec.parse({"script": "train.py", "name": name, "cluster": cluster})


def test_a_job_on_a_busy_existing_cluster_waits_for_that_cluster_only(store: Store) -> None:
    hold(store, 1)
    first = submit(store, on("a"))
    assert isinstance(first, tuple) and first[1].name == "hold"
    got = submit(store, on("b"))
    assert isinstance(got, QueuedJob)
    assert (got.cluster, got.count, got.gpu, got.pool) == ("hold", 1, "cpu", "local")
    with pytest.raises(ConflictError) as behind:
        submit(store, on("c"), queue=False)
    assert one_line(behind).startswith("queue: jobs are waiting")
    # b waits for cluster hold, not for new devices: a job for the free slot is not behind it
    free = submit(store, spec("n", 1), queue=False)
    assert isinstance(free, tuple) and free[1].for_job == "n"


def test_a_job_held_by_its_teams_limits_holds_up_no_one(store: Store) -> None:
    team_with_quota(store, 1)
    assert isinstance(submit(store, spec("mine", 1)), tuple)
    assert isinstance(submit(store, spec("over", 1)), QueuedJob)  # vision's quota is in use
    other = submit(store, spec("bos", 1), who=BO, queue=False)  # the free slot is bo's to take
    assert isinstance(other, tuple)
    assert [e.name for e in queued.waiting(store)] == ["over"]


def test_cancel_by_its_owner_or_an_admin_but_not_another_user(store: Store) -> None:
    hold(store)
    for name, who in (("a1", ANA), ("a2", ANA), ("b1", BO)):
        assert isinstance(submit(store, spec(name, 1), who=who), QueuedJob)
    with pytest.raises(ForbiddenError, match="cancel a1: it is not yours \\(bo\\)"):
        queued.cancel(store, "a1", BO)
    assert queued.entry(store, "a1").status == QueueStatus.QUEUED  # type: ignore[union-attr]
    done = queued.cancel(store, "a1", ANA, now=100.0)
    assert (done.status, done.reason, done.left_at) == (QueueStatus.CANCELLED,
                                                       "cancelled by ana", 100.0)
    assert queued.cancel(store, "b1", ADMIN).reason == "cancelled by root"
    with pytest.raises(ConflictError, match="is cancelled, not queued"):
        queued.cancel(store, "a1", ANA)
    with pytest.raises(NotFoundError):
        queued.cancel(store, "nothing", ANA)
    assert [e.name for e in queued.waiting(store)] == ["a2"]
    cancels = [e for e in accounts.audit_log(store) if e["action"] == "cancel"]
    assert [(e["user"], e["subject"]) for e in cancels] == [("root", "b1"), ("ana", "a1")]


def test_cancel_of_a_job_that_started_says_to_stop_it(store: Store) -> None:
    started = submit(store, spec("j1", 1))
    assert isinstance(started, tuple)
    with pytest.raises(ConflictError, match="not queued \\(it started\\); stop it"):
        queued.cancel(store, "j1", ANA)
    with store.session() as s:  # the queue started it: its entry says so
        s.add(QueuedJob(name="j2", user="ana", team=None, priority=0, submitted_at=1.0,
                        spec_json="{}", pool="local", gpu="cpu", count=1,
                        status=QueueStatus.STARTED))
    with pytest.raises(ConflictError, match="is started, not queued; stop it"):
        queued.cancel(store, "j2", ANA)
