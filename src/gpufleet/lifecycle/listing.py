"""`gpufleet jobs`: queued, running and ended jobs in one list, as plain rows (the CLI prints
them, the API returns them, the dashboard draws them).

A user sees their own jobs; an admin everyone's (or one user's). Without `every`, ended jobs
are those of the last day.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from gpufleet.lifecycle import jobs
from gpufleet.lifecycle.accounts import Identity
from gpufleet.lifecycle.status import QueueStatus
from gpufleet.store import Cluster, Job, QueuedJob, Store
from gpufleet.supervise.view import job_cost_usd

RECENT_S = 24 * 3600.0


def queued_row(e: QueuedJob) -> dict[str, Any]:
    return {"name": e.name, "user": e.user, "team": e.team, "status": e.status,
            "priority": e.priority, "position": e.position, "est_start": e.est_start,
            "wait": e.wait, "reason": e.reason, "gpu": e.gpu, "count": e.count,
            "cluster": e.cluster, "pool": e.pool, "submitted_at": e.submitted_at,
            "started_at": None, "ended_at": e.left_at, "cost_usd": 0.0,
            "time_limit_s": e.time_limit_s, "step": None, "total_steps": None}


def _priority(spec_json: str) -> int:
    try:
        return int(json.loads(spec_json).get("priority") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0


def job_row(j: Job, c: Cluster, e: QueuedJob | None, now: float) -> dict[str, Any]:
    return {"name": j.name, "user": j.user, "team": j.team, "status": j.status,
            "priority": e.priority if e else _priority(j.spec_json), "position": None, "est_start": None,
            "wait": None, "reason": j.reason, "gpu": c.gpu, "count": c.count,
            "cluster": c.name, "pool": c.pool or "local",
            "submitted_at": e.submitted_at if e else j.created_at,
            "started_at": j.started_at, "ended_at": j.ended_at,
            "cost_usd": job_cost_usd(j, c, now),
            "time_limit_s": e.time_limit_s if e else None,
            "step": j.step, "total_steps": j.total_steps}


def table(store: Store, who: Identity, now: float, every: bool = False,
          user: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
    """Queued jobs first (in their order), then running, then ended (newest first). Every
    queued job is listed; of the jobs and the queue's history (cancelled, refused), the newest
    `limit` each."""
    if not who.admin:
        user = who.user
    wq = select(QueuedJob).where(QueuedJob.status == QueueStatus.QUEUED)
    lq = select(QueuedJob).where(QueuedJob.status.not_in((QueueStatus.QUEUED,
                                                          QueueStatus.STARTED))) \
        .order_by(QueuedJob.left_at.desc()).limit(limit)
    jq = select(Job, Cluster).join(Cluster, Cluster.id == Job.cluster_id) \
        .order_by(Job.id.desc()).limit(limit)
    if user is not None:
        wq = wq.where(QueuedJob.user == user)
        lq = lq.where(QueuedJob.user == user)
        jq = jq.where(Job.user == user)
    if not every:
        lq = lq.where(QueuedJob.left_at >= now - RECENT_S)
        jq = jq.where(Job.status.in_(jobs.ACTIVE) | (Job.ended_at >= now - RECENT_S))
    with store.read() as s:
        entries = [*s.scalars(wq), *s.scalars(lq)]
        found = [(j, c) for j, c in s.execute(jq)]
        names = [j.name for j, _ in found]
        origin = {e.name: e for e in s.scalars(select(QueuedJob).where(QueuedJob.name.in_(names)))}
    waiting = sorted((e for e in entries if e.status == QueueStatus.QUEUED),
                     key=lambda e: (e.position or 10**9, e.id))
    left = sorted((e for e in entries if e.status != QueueStatus.QUEUED),
                  key=lambda e: -(e.left_at or 0))
    rows = [queued_row(e) for e in waiting]
    rows += [job_row(j, c, origin.get(j.name), now) for j, c in found if j.status in jobs.ACTIVE]
    ended = [job_row(j, c, origin.get(j.name), now) for j, c in found
             if j.status not in jobs.ACTIVE]
    ended += [queued_row(e) for e in left]
    ended.sort(key=lambda r: -(r["ended_at"] or 0))
    return rows + ended
