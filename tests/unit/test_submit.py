"""What `lifecycle.submit` refuses before anything starts, decided by the pool's capabilities
(not its name), how many workers a job starts with, and what a resume says it starts from."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import durable_copy
from gpufleet.errors import SpecError
from gpufleet.lifecycle.admission import check_pool_job, first_world
from gpufleet.lifecycle.submit import resume_note
from gpufleet.spec import JobSpec
from gpufleet.store import Cluster, Event, Job, Store

HERE = Path(__file__).resolve()


def _spec(**extra: object) -> JobSpec:
    return JobSpec.parse({"script": HERE.name, "workdir": str(HERE.parent), "cluster": "c",
                          **extra})


def test_a_simulated_pool_runs_no_job() -> None:
    with pytest.raises(SpecError, match="simulated pool only plans"):
        check_pool_job(_spec(), "sim", 1)


def test_off_this_host_only_multi_node_frameworks_and_no_elastic() -> None:
    check_pool_job(_spec(framework="deepspeed"), "ray", 2)
    with pytest.raises(SpecError, match="runs on this host's pool only"):
        check_pool_job(_spec(framework="accelerate"), "ray", 1)
    with pytest.raises(SpecError, match="elastic resizing runs on the local pool only"):
        check_pool_job(_spec(workers="1:2"), "ray", 1)


def test_this_host_takes_any_framework_and_elastic_jobs() -> None:
    check_pool_job(_spec(framework="accelerate"), "local", 1)
    check_pool_job(_spec(workers="1:2"), None, 1)


def test_first_world_is_one_worker_per_device_unless_told() -> None:
    assert first_world(_spec(), 4, "c") == 4
    assert first_world(_spec(workers_per_node=2), 8, "c", nodes=2) == 4


# -- what `run --resume` says it will start from, before it starts -----------------------------

def _checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    if complete:
        (folder / "manifest.json").write_text('{"files": {}}')
    return folder


def test_resume_names_gpufleets_newest_complete_checkpoint(tmp_path: Path) -> None:
    store = Store(url=f"sqlite:///{tmp_path / 's.db'}")
    durable = tmp_path / "durable"
    job = Job(id=1, name="kr", job_dir=str(tmp_path / "jobs" / "kr"))
    mine = Path(job.job_dir) / "checkpoints"
    _checkpoint(mine, 10)
    newest = _checkpoint(mine, 15)
    _checkpoint(mine, 20, complete=False)  # cut short by the kill: never loaded
    assert resume_note(store, job, _spec()) == (
        f"from gpufleet's checkpoint at step 15 ({newest}), or the one before it if that one "
        "is found damaged")
    far = _checkpoint(durable, 30)  # only the durable copy has it (a new node's empty folder)
    assert f"step 30 ({far})" in resume_note(store, job, _spec(checkpoint_to=str(durable)))
    store.close()


def test_resume_of_a_copy_at_a_url_names_the_step_its_events_say_was_copied(
        tmp_path: Path) -> None:
    store = Store(url=f"sqlite:///{tmp_path / 's.db'}")
    with store.session() as s:
        c = Cluster(name="c", gpu="cpu", count=1, nodes=1, network="pcie", disk_bytes=1,
                    backend="local", status="stopped", created_at=0.0, scratch_dir="/x",
                    spec_json="{}")
        s.add(c)
        s.flush()
        job = Job(name="kr", cluster_id=c.id, status="interrupted", spec_json="{}",
                  job_dir=str(tmp_path / "kr"), world_size=1, created_at=0.0, samples=0)
        s.add(job)
        s.flush()
        s.add(Event(job_id=job.id, time=1.0, kind="checkpoint_copied",
                    reason=durable_copy.copied_text(40, "s3://b/kr/step-00000040")))
    got = resume_note(store, job, _spec(checkpoint_to="s3://b/kr"))
    assert got.startswith("from gpufleet's checkpoint at step 40 (s3://b/kr)")
    store.close()


def test_resume_without_a_checkpoint_of_gpufleets_says_the_script_starts_as_written(
        tmp_path: Path) -> None:
    """nanoGPT keeps its own checkpoints, and resumes only when its arguments say so."""
    store = Store(url=f"sqlite:///{tmp_path / 's.db'}")
    job = Job(id=1, name="nano", job_dir=str(tmp_path / "jobs" / "nano"))
    spec = _spec(args=["config/train_shakespeare_char.py", "--max_iters=200"])
    assert resume_note(store, job, spec) == (
        "gpufleet holds no checkpoint of it: the script runs again as first started, "
        f"{HERE.name} config/train_shakespeare_char.py --max_iters=200 in {HERE.parent}, and "
        "starts from scratch unless it resumes from files of its own")
    store.close()
