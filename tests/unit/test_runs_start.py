"""`runs.start_detached` owns "start the supervisor; if that fails, fail the job and free its
cluster" for every caller (the CLI's `run -d`, the server's POST /jobs, the queue's dispatch):
a real start that fails (no interpreter at that path), against a real SQLite file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.lifecycle import clusters, jobs, runs
from gpufleet.pool.model import Device, Node
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.status import ClusterStatus, JobStatus
from gpufleet.store import Reservation, Store

HERE = Path(__file__).resolve()
NODES = [Node("host", "127.0.0.1", tuple(Device(id=f"cpu{i}", index=i, gpu="cpu",
                                                 memory_bytes=0) for i in range(4)),
              free_disk_bytes=1 << 40)]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    return Store(url=f"sqlite:///{tmp_path}/s.db")


def _job(store: Store, name: str, cluster: str, for_job: bool) -> jobs.Job:
    c = clusters.launch(store, ClusterSpec.parse({"name": cluster, "gpu": "cpu", "count": 2}),
                        NODES, for_job=name if for_job else None)
    spec = JobSpec.parse({"name": name, "script": HERE.name, "workdir": str(HERE.parent),
                          "cluster": cluster})
    return jobs.create(store, spec, c, 2)


def _held(store: Store) -> list[str]:
    with store.read() as s:
        return sorted(s.scalars(select(Reservation.device_id)))


def test_a_supervisor_that_cannot_start_fails_its_job_and_frees_its_cluster(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job(store, "j", "run-j", for_job=True)
    assert _held(store) == ["cpu0", "cpu1"]
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    with pytest.raises(runs.NotStarted) as caught:
        runs.start_detached(store, job)
    assert caught.value.why.startswith("its supervisor could not start: [Errno 2]")
    assert str(caught.value) == f"job j: {caught.value.why}"
    ended = jobs.get(store, "j")
    assert (ended.status, ended.reason) == (JobStatus.FAILED, caught.value.why)
    assert ended.supervisor_pid is None
    assert _held(store) == []
    assert clusters.get(store, "run-j").status == ClusterStatus.STOPPED


def test_a_cluster_the_user_launched_is_kept_when_its_job_cannot_start(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job(store, "k", "mine", for_job=False)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    with pytest.raises(runs.NotStarted):
        runs.start_detached(store, job)
    assert jobs.get(store, "k").status == JobStatus.FAILED
    assert _held(store) == ["cpu0", "cpu1"]  # not the job's to free
    assert clusters.get(store, "mine").status == ClusterStatus.RUNNING
