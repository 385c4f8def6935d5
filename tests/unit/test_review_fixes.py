"""Job cost over the job's run, ETA from the first reported step, exact sample totals, the
CPU-slot default, variables a job may not set, and compare-and-set job transitions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.backends.local import cpu_slot_count
from gpufleet.errors import SpecError
from gpufleet.lifecycle import jobs
from gpufleet.plan import billing
from gpufleet.plan.billing import job_cost_usd
from gpufleet.spec import JobSpec
from gpufleet.store import Cluster, Job, Store
from gpufleet.supervise.progress import Report, Throughput
from gpufleet.supervise.view import seconds_per_step

RATE = 3.6  # $/hour: one cent per 10 seconds


def _cluster(started: float = 0.0, stopped: float | None = None) -> Cluster:
    return Cluster(name="c", gpu="cpu", usd_per_hour=RATE, status="running" if stopped is None
                   else "stopped", started_at=started, stopped_at=stopped)


def test_job_cost_is_the_clusters_rate_over_the_jobs_run() -> None:
    # the cluster ran from 0 and still runs at 1000: only the job's run, 100 s to 160 s, counts
    c = _cluster()
    job = Job(name="j", created_at=100.0, ended_at=160.0, run_from_micro_usd=None,
              billed_micro_usd=billing.meter_micro(c, 160.0) - billing.meter_micro(c, 100.0))
    assert job_cost_usd(job, c, now=1000.0) == pytest.approx(RATE * 60 / 3600)


def test_running_job_cost_grows_until_the_cluster_stops() -> None:
    job = Job(name="j", created_at=100.0, billed_micro_usd=0,
              run_from_micro_usd=billing.meter_micro(_cluster(), 100.0))
    assert job_cost_usd(job, _cluster(), now=130.0) == pytest.approx(RATE * 30 / 3600)
    stopped = _cluster(stopped=120.0)
    assert job_cost_usd(job, stopped, now=500.0) == pytest.approx(RATE * 20 / 3600)


def test_seconds_per_step_from_the_first_reported_step() -> None:
    # a resumed run: first report at step 5001, then 100 steps of 0.1 s
    job = Job(name="j", step=5101, first_step=5001, first_step_at=1000.0, last_report_at=1010.0)
    assert seconds_per_step(job) == pytest.approx(0.1)
    # reports every 10 steps starting at step 10
    job = Job(name="j", step=100, first_step=10, first_step_at=0.0, last_report_at=9.0)
    assert seconds_per_step(job) == pytest.approx(0.1)


def test_sample_total_survives_dropped_reports() -> None:
    t = Throughput()
    t.add(Report(t=0.0, rank=0, step=1, samples=8, samples_total=8))
    # steps 2..9 were lost in transit; step 10 carries the running total
    t.add(Report(t=1.0, rank=0, step=10, samples=8, samples_total=80))
    assert t.total_samples == 80
    assert t.samples_per_s() == pytest.approx(72.0)


def test_cpu_slots_default_to_cores_capped_at_the_job_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_CPU_SLOTS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 224)
    assert cpu_slot_count() == 128
    with pytest.raises(SpecError, match="cpu_slots: got 224"):
        cpu_slot_count(224)  # asked for explicitly: refused with the limit


@pytest.mark.parametrize("key", ["CUDA_VISIBLE_DEVICES", "GPUFLEET_JOB", "RANK", "MASTER_PORT"])
def test_job_env_may_not_change_what_gpufleet_sets(key: str, tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(SpecError) as err:
        JobSpec.parse({"script": str(script), "env": {key: "0"}})
    assert err.value.problems[0][0] == "env" and key in err.value.problems[0][1]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def _job(store: Store) -> tuple[int, int]:
    with store.session() as s:
        c = Cluster(name="c", gpu="cpu", count=1, nodes=1, network="pcie", disk_bytes=1,
                    backend="local", usd_per_hour=0.0, status="running", created_at=0.0,
                    started_at=0.0, scratch_dir="/nonexistent", spec_json="{}")
        s.add(c)
        s.flush()
        j = Job(name="j", cluster_id=c.id, status="starting", spec_json="{}", job_dir="/x",
                world_size=1, created_at=0.0, samples=0)
        s.add(j)
        s.flush()
        return j.id, c.id


def test_a_stopped_job_cannot_be_started_again(store: Store) -> None:
    job_id, cluster_id = _job(store)
    assert jobs.transition(store, job_id, "stopped", "stop came first", expect=("starting",))
    assert not jobs.begin_running(store, job_id, cluster_id, "late supervisor")
    assert jobs.get(store, "j").status == "stopped"
    assert [e.kind for e in jobs.events(store, job_id)] == ["stopped"]


def test_a_finished_job_is_not_overwritten(store: Store) -> None:
    job_id, cluster_id = _job(store)
    assert jobs.begin_running(store, job_id, cluster_id, "started")
    assert jobs.transition(store, job_id, "succeeded", "done")
    assert not jobs.transition(store, job_id, "stopped", "a stale stop")
    assert jobs.get(store, "j").status == "succeeded"


def test_no_start_on_a_stopped_cluster(store: Store) -> None:
    job_id, cluster_id = _job(store)
    with store.session() as s:
        c = s.get(Cluster, cluster_id)
        assert c is not None
        c.status = "stopped"
    assert not jobs.begin_running(store, job_id, cluster_id, "too late")
    assert jobs.get(store, "j").status == "starting"
