"""`gpufleet.snapshot_job` (`status` of an ended job read with stdlib sqlite3) and the store
agree: the columns and spec fields it reads are the models', its dict equals
`views.job_detail`'s on a real store for the same `now`, and it steps aside (None) whenever the
store must answer."""

from __future__ import annotations

import sqlite3
import time
import typing
from pathlib import Path
from typing import Any

import pytest

from gpufleet import snapshot, snapshot_job, views
from gpufleet.spec import JobSpec
from gpufleet.store import Cluster, Diagnosis, Event, Job, Metric, Reservation, Store
from gpufleet.store.db import SCHEMA_VERSION
from gpufleet.store.models import Base
from gpufleet.supervise import view
from gpufleet.telemetry.records import label

NOW = 1_000_000.0


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    return Store()


def _spec(**extra: Any) -> str:
    return JobSpec.model_validate({"script": "train.py", "cluster": "c1", **extra}).model_dump_json()


def _cluster(store: Store, status: str = "stopped", **extra: Any) -> int:
    with store.session() as s:
        c = Cluster(name="c1", gpu="cpu", count=4, nodes=2, network="pcie", disk_bytes=1 << 30,
                    backend="local", price_book="marketplace", usd_per_hour=2.5, status=status,
                    created_at=NOW - 900, started_at=NOW - 800,
                    stopped_at=NOW - 10 if status == "stopped" else None, scratch_dir="/tmp/x",
                    spec_json="{}", banked_usd=0.25, rate_since=NOW - 500, **extra)
        s.add(c)
        s.flush()
        return c.id


def _job(store: Store, cluster_id: int, name: str = "train-1", status: str = "succeeded",
         spec_json: str | None = None) -> int:
    with store.session() as s:
        j = Job(name=name, cluster_id=cluster_id, status=status,
                spec_json=spec_json or _spec(strategy="fsdp", precision="bf16-mixed"),
                job_dir="/tmp/j", world_size=4, created_at=NOW - 700, started_at=NOW - 690,
                ended_at=None if status in snapshot_job.ACTIVE else NOW - 20, exit_code=0,
                step=200, total_steps=200, samples=6400, loss=1.5, first_loss=4.0,
                samples_per_s=32.0, first_step=1, first_step_at=NOW - 680,
                last_report_at=NOW - 21, reason="exit code 0")
        s.add(j)
        s.flush()
        return j.id


def _history(store: Store, job_id: int, name: str) -> None:
    """Events, findings (two that tie on the sort key), and device, rank, job and model-state
    samples, some outside the latest window and some at the same time."""
    with store.session() as s:
        for i, kind in enumerate(("starting", "running", "checkpoint", "succeeded")):
            s.add(Event(job_id=job_id, time=NOW - 700 + i, kind=kind, reason=f"r{i}"))
        for key, sev, active, first in (("slow:gpu0", "warning", False, NOW - 300),
                                        ("wait:rank 1", "critical", True, NOW - 200),
                                        ("comm:b", "info", True, NOW - 250),
                                        ("comm:a", "info", True, NOW - 250)):
            s.add(Diagnosis(job_id=job_id, key=key, rule=key.split(":")[0], severity=sev,
                            subject=key.split(":")[1], title=f"t {key}", detail="d", fix="f",
                            first_seen=first, last_seen=first + 5, active=active))
        samples: list[tuple[float, int, str | None, str, float]] = [
            (NOW - 100, -1, "gpu0", "util", 0.5), (NOW - 60, -1, "gpu0", "util", 0.9),
            (NOW - 60, -1, "gpu1", "util", 0.7), (NOW - 200, 0, None, "step_time", 9.0),
            (NOW - 50, 0, None, "step_time", 0.3), (NOW - 50, 1, None, "step_time", 0.4),
            (NOW - 40, -1, None, "loss", 1.5),
            (NOW - 300, 0, None, "params_bytes", 1e6), (NOW - 30, 0, None, "params_bytes", 2e6),
            (NOW - 30, 1, None, "grads_bytes", 3e6), (NOW - 30, 1, None, "optimizer_bytes", 4e6)]
        for t, rank, device, metric, value in samples:
            node = "worker1" if rank == 1 else "n0"  # a rank labelled with the node it ran on
            s.add(Metric(time=t, cluster="c1", job=name, node=node, rank=rank, name=metric,
                         value=value, device=device))
        s.add(Metric(time=NOW - 30, cluster="c1", job="other", node="n0", rank=0, name="util",
                     value=0.1, device="gpu9"))


def _quick(name: str = "train-1") -> dict[str, Any] | None:
    return snapshot_job.job_detail(snapshot.state_path(), name, NOW)


def test_it_reads_only_columns_and_spec_fields_the_models_define() -> None:
    for table, cols in snapshot_job.COLUMNS.items():
        assert set(cols) <= set(Base.metadata.tables[table].columns.keys()), table
    fields = JobSpec.model_fields
    assert set(fields) == snapshot_job.SPEC_FIELDS
    for key in snapshot_job.SPEC_WORDS:
        assert all(isinstance(v, str) for v in typing.get_args(fields[key].annotation)), key
    for key, (low, high) in snapshot_job.SPEC_INT_BOUNDS.items():
        bounds = {type(m).__name__: m for m in fields[key].metadata}
        assert (bounds["Ge"].ge, bounds["Le"].le) == (low, high), key
    assert snapshot_job._label(-1, None) == label(-1, None) == "job"
    assert snapshot_job._label(3, None) == label(3, None)


@pytest.mark.parametrize("cluster_status", ["stopped", "running"])
def test_an_ended_job_reads_the_same_as_through_the_store(store: Store,
                                                          cluster_status: str) -> None:
    cid = _cluster(store, cluster_status, simulated=cluster_status == "running")
    with store.session() as s:  # a kept cluster still holds devices on two nodes
        for node, dev, idx in (("n1", "cpu1", 1), ("n0", "cpu1", 1), ("n0", "cpu0", 0)):
            s.add(Reservation(cluster_id=cid, node_id=node, address="127.0.0.1", device_id=dev,
                              device_index=idx))
    jid = _job(store, cid)
    _history(store, jid, "train-1")
    quick = _quick()
    assert quick is not None  # the fast path answered, not the fallback
    assert quick == views.job_detail(store, "train-1", NOW)
    assert quick["layout"] and quick["layout"].startswith("fsdp")
    assert quick["model_state"] and quick["latest"]["gpu1"] and quick["findings"][0]["active"]
    assert quick["cluster_info"]["devices"] == ["n0/cpu0", "n0/cpu1", "n1/cpu1"]
    assert quick["nodes"] == {"gpu0": "n0", "gpu1": "n0", "rank 0": "n0", "rank 1": "worker1"}


@pytest.mark.parametrize("spec", [
    _spec(strategy="tp", tp=2, pp=2, pp_schedule="gpipe", microbatches=8),
    _spec(strategy="pp", pp=4, precision="fp16-mixed", framework="deepspeed"),
    _spec(strategy="tp", tp=3),  # no layout on 4 workers: None both ways
    _spec(strategy="zero1", tp=2),
])
def test_layout_words_match_the_validated_spec(spec: str) -> None:
    assert snapshot_job.layout_words(spec, 4) == view.requested_layout(spec, 4)


def test_a_spec_stored_before_after_existed_is_read_the_same_way() -> None:
    import json

    old = json.loads(_spec(strategy="tp", tp=2, pp=2, pp_schedule="gpipe", microbatches=8))
    for key in ("warm", "preload"):  # stored before warm workers
        del old[key]
    words = snapshot_job.layout_words(json.dumps(old), 4)
    assert words is not None and words == view.requested_layout(json.dumps(old), 4)
    for key in ("image", "pull", "container_opts", "shm_size"):  # stored before images
        del old[key]
    words = snapshot_job.layout_words(json.dumps(old), 4)
    assert words is not None and words == view.requested_layout(json.dumps(old), 4)
    for key in ("setup", "max_upload", "keep_workdir"):  # stored before the workdir travelled
        del old[key]
    words = snapshot_job.layout_words(json.dumps(old), 4)
    assert words is not None and words == view.requested_layout(json.dumps(old), 4)
    del old["after"]
    words = snapshot_job.layout_words(json.dumps(old), 4)
    assert words is not None and words == view.requested_layout(json.dumps(old), 4)


@pytest.mark.parametrize("spec", [
    '{"script": "old.py"}',  # keys of another version
    "not json",
    _spec(cluster={"gpu": "cpu", "count": 2}),  # a cluster spec: the catalog's checks
    _spec().replace('"dp":null', '"dp":"2"'),
    _spec().replace('"dp":null', '"dp":999'),
])
def test_a_spec_it_cannot_vouch_for_goes_through_pydantic(spec: str) -> None:
    with pytest.raises(snapshot_job.Declined):
        snapshot_job.layout_words(spec, 4)


def test_it_steps_aside_when_the_store_must_answer(store: Store, tmp_path: Path) -> None:
    assert snapshot_job.job_detail(tmp_path / "missing.db", "train-1", NOW) is None
    cid = _cluster(store, "running")
    _job(store, cid, "live", "running")  # its supervisor may have died: reconcile first
    _job(store, cid, "done", "succeeded")  # reconcile may stop the cluster it shares
    assert _quick("live") is None and _quick("done") is None
    assert _quick("nobody") is None  # the store says which jobs there are
    other = _cluster(store, "stopped")
    _job(store, other, "odd", "failed", spec_json='{"script": "x.py"}')
    assert _quick("odd") is None


def test_another_schema_version_goes_through_the_store(store: Store) -> None:
    _job(store, _cluster(store))
    assert _quick() is not None
    with sqlite3.connect(snapshot.state_path()) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    assert _quick() is None


def test_a_missing_table_goes_through_the_store(store: Store) -> None:
    _job(store, _cluster(store))
    with sqlite3.connect(snapshot.state_path()) as db:
        db.execute("DROP TABLE findings")
    db.close()
    assert _quick() is None


def test_it_passes_a_real_clock_through(store: Store) -> None:
    _job(store, _cluster(store))
    now = time.time()
    assert snapshot_job.job_detail(snapshot.state_path(), "train-1", now) == \
        views.job_detail(store, "train-1", now)
