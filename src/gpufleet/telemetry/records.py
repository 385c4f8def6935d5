"""Telemetry in the store: reading series for charts and the API, keeping diagnosis findings.

The dashboard, `status` and `/metrics` read only through here, so they show the same numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select

from gpufleet.status import JobStatus
from gpufleet.store import Diagnosis, Event, Job, Metric, Store
from gpufleet.telemetry.diagnose import Finding
from gpufleet.telemetry.schema import JOB_RANK, STEP_METRIC


def series(store: Store, job: str, since: float = 0.0, names: Iterable[str] | None = None,
           max_points: int = 600) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """name -> label -> [(time, value)] after `since`, oldest first. Labels: "job", "rank 3",
    or a device id ("gpu3", "cpu1"). Long series are thinned to `max_points` by keeping every k-th point
    (and the last), which is what a chart a few hundred pixels wide can show."""
    q = select(Metric.name, Metric.rank, Metric.device, Metric.time, Metric.value).where(
        Metric.job == job, Metric.time > since).order_by(Metric.time)
    wanted = list(names) if names is not None else None
    if wanted is not None:
        q = q.where(Metric.name.in_(wanted))
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    with store.read() as s:
        for name, rank, device, t, value in s.execute(q):
            out.setdefault(name, {}).setdefault(label(rank, device), []).append((t, value))
    for by_label in out.values():
        for key, points in by_label.items():
            if len(points) > max_points:
                k = -(-len(points) // max_points)
                by_label[key] = points[::k] + ([points[-1]] if (len(points) - 1) % k else [])
    return out


def label(rank: int, device: str | None) -> str:
    if device is not None:
        return device
    return "job" if rank == JOB_RANK else f"rank {rank}"


def latest(store: Store, job: str, window_s: float = 30.0) -> dict[str, dict[str, float]]:
    """The newest value of every series within the last `window_s` seconds of the job's data:
    label -> name -> value (what the device table and /metrics show)."""
    with store.read() as s:
        newest = s.execute(select(Metric.time).where(Metric.job == job)
                           .order_by(Metric.time.desc()).limit(1)).scalar()
        if newest is None:
            return {}
        rows = s.execute(select(Metric.name, Metric.rank, Metric.device, Metric.value)
                         .where(Metric.job == job, Metric.time >= newest - window_s)
                         .order_by(Metric.time)).all()
    out: dict[str, dict[str, float]] = {}
    for name, rank, device, value in rows:
        out.setdefault(label(rank, device), {})[name] = value  # later rows win
    return out


def nodes(store: Store, job: str, window_s: float = 30.0) -> dict[str, str]:
    """The node each series of `latest` came from (label -> node, as the cluster names it:
    "local" on this host, head, worker1... on Ray and Slurm), over the same window."""
    with store.read() as s:
        newest = s.execute(select(Metric.time).where(Metric.job == job)
                           .order_by(Metric.time.desc()).limit(1)).scalar()
        if newest is None:
            return {}
        rows = s.execute(select(Metric.rank, Metric.device, Metric.node)
                         .where(Metric.job == job, Metric.time >= newest - window_s)
                         .order_by(Metric.time)).all()
    out = {label(rank, device): node for rank, device, node in rows}  # later rows win
    out.pop("job", None)  # the job's own figures ran on no one node
    return out


def rank0_step_at(store: Store, job: str, t: float) -> float | None:
    """The step rank 0 had reported at `t` (its newest `step` sample at or before it), or None
    before its first report: where a moment sits on a chart's step axis."""
    with store.read() as s:
        return s.execute(select(Metric.value).where(
            Metric.job == job, Metric.name == STEP_METRIC, Metric.rank == 0,
            Metric.time <= t).order_by(Metric.time.desc()).limit(1)).scalar()


def save_findings(store: Store, job_id: int, found: list[Finding], now: float,
                  final: bool = False) -> list[Finding]:
    """Record this round's findings; return the ones that are new (each also becomes a
    'diagnosis' event, so the job's history says when a problem appeared). A finding absent
    from the round is kept, marked inactive, except in the round after the job ended (which
    only reads the logs): what held at the end still held."""
    new: list[Finding] = []
    with store.session() as s:
        rows = {r.key: r for r in s.scalars(select(Diagnosis).where(Diagnosis.job_id == job_id))}
        for f in found:
            row = rows.pop(f.key, None)
            if row is None:
                s.add(Diagnosis(job_id=job_id, key=f.key, rule=f.rule, severity=f.severity,
                                subject=f.subject, title=f.title, detail=f.detail, fix=f.fix,
                                first_seen=now, last_seen=now, active=True))
                s.add(Event(job_id=job_id, time=now, kind="diagnosis",
                            reason=f"{f.title} ({f.severity}). Try: {f.fix}"))
                new.append(f)
                continue
            if not row.active:
                s.add(Event(job_id=job_id, time=now, kind="diagnosis",
                            reason=f"{f.title} ({f.severity}), again. Try: {f.fix}"))
            row.severity, row.title, row.detail, row.fix = f.severity, f.title, f.detail, f.fix
            row.last_seen, row.active = now, True
        if not final:
            for row in rows.values():
                row.active = False
    return new


def findings(store: Store, job_id: int) -> list[dict[str, Any]]:
    """Every finding of the job, active ones first, most severe first."""
    order = {"critical": 0, "warning": 1, "info": 2}
    with store.read() as s:
        rows = list(s.scalars(select(Diagnosis).where(Diagnosis.job_id == job_id)))
    rows.sort(key=lambda r: (not r.active, order.get(r.severity, 3), r.first_seen))
    return [{"rule": r.rule, "severity": r.severity, "subject": r.subject, "title": r.title,
             "detail": r.detail, "fix": r.fix, "first_seen": r.first_seen,
             "last_seen": r.last_seen, "active": r.active} for r in rows]


def baseline_samples_per_s(store: Store, job: Job, gpu: str) -> float | None:
    """The throughput of the latest successful one-worker run of the same script and arguments
    on the same GPU type: the yardstick for this job's scaling efficiency."""
    from gpufleet.store import Cluster

    try:
        spec = json.loads(job.spec_json)
    except ValueError:
        return None
    with store.read() as s:
        rows = s.execute(select(Job.spec_json, Job.samples_per_s).join(
            Cluster, Cluster.id == Job.cluster_id).where(
            Job.status == JobStatus.SUCCEEDED, Job.world_size == 1, Job.id != job.id,
            Cluster.gpu == gpu, Job.samples_per_s.is_not(None)).order_by(Job.id.desc())
            .limit(200)).all()
    for spec_json, sps in rows:
        try:
            other = json.loads(spec_json)
        except ValueError:
            continue
        if other.get("script") == spec.get("script") and other.get("args") == spec.get("args") \
                and sps is not None:
            return float(sps)
    return None
