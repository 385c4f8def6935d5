"""`gpufleet jobs`: queued, running and ended jobs in one list, as plain rows (the CLI prints
them, the API returns them, the dashboard draws them).

A user sees their own jobs; an admin everyone's (or one user's). With `everyone`, a user also
sees the whole queue as squeue shows it: every user's queued and running jobs, in queue order
with their place and estimated start, but another user's job only as its user, team, devices,
priority and times: its name, cluster, cost, progress and any reason that could name a job or a
cluster are hidden (`masked`). Without `every`, ended jobs are those of the last day.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import false, select, true

from gpufleet.lifecycle import jobs
from gpufleet.lifecycle.accounts import Identity
from gpufleet.plan import billing
from gpufleet.sched.model import Wait
from gpufleet.status import QueueStatus
from gpufleet.store import Cluster, Job, QueuedJob, Store

RECENT_S = 24 * 3600.0
HIDDEN = "(hidden)"  # another user's job name, as a user sees it (no job name has parentheses)
# what another user's job waits for, in words that name no job and no cluster; the texts of
# the other waits (devices, behind the job at position N) name neither and are kept
_MASKED_REASON = {Wait.CLUSTER: "its cluster is running another job",
                  Wait.QUOTA: "its team's quota is in use",
                  Wait.BUDGET: "its team's budget", Wait.HELD: "held",
                  Wait.AFTER: "after another job of its user"}


def queued_row(e: QueuedJob) -> dict[str, Any]:
    return {"name": e.name, "user": e.user, "team": e.team, "status": e.status,
            "priority": e.priority, "position": e.position, "est_start": e.est_start,
            "start_note": e.start_note, "wait": e.wait, "reason": e.reason,
            "after": e.after, "held_by": e.held_by, "gpu": e.gpu, "count": e.count,
            "cluster": e.cluster, "pool": e.pool, "submitted_at": e.submitted_at,
            "started_at": None, "ended_at": e.left_at, "cost_usd": 0.0,
            "time_limit_s": e.time_limit_s, "step": None, "total_steps": None,
            "hidden": False}


def masked(row: dict[str, Any]) -> dict[str, Any]:
    """Another user's row as a user sees it: where it stands in the queue, not what it is."""
    wait = row.get("wait")
    reason = row.get("reason")
    if wait in _MASKED_REASON:
        reason = _MASKED_REASON[Wait(wait)]
    elif wait not in (Wait.DEVICES, Wait.BEHIND):
        reason = None  # a running job's reason (a restart's error) is its owner's
    note = row.get("start_note")
    return {**row, "name": HIDDEN, "hidden": True, "cluster": None, "reason": reason,
            "after": None, "held_by": None, "cost_usd": None, "step": None,
            "total_steps": None,
            "start_note": _MASKED_REASON[Wait.AFTER] if wait == Wait.AFTER else note}


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
            "cost_usd": billing.job_cost_usd(j, c, now),
            "time_limit_s": e.time_limit_s if e else None,
            "step": j.step, "total_steps": j.total_steps, "hidden": False}


def table(store: Store, who: Identity, now: float, every: bool = False,
          user: str | None = None, limit: int = 500,
          everyone: bool = False) -> list[dict[str, Any]]:
    """Queued jobs first (in their order), then running, then ended (newest first). Every
    queued job is listed; of the jobs and the queue's history (cancelled, refused), the newest
    `limit` each. `everyone`: every user's queued and running jobs too (others' `masked` for a
    user who is not an admin); `user` then narrows the list to that user's."""
    live = user if who.admin or everyone else who.user  # whose queued and running jobs
    past = user if who.admin else who.user  # whose ended jobs and queue history

    def of(col: Any, name: str | None) -> Any:
        return true() if name is None else col == name

    def history(col: Any) -> Any:  # another user's is not a user's to see, even with `user`
        return false() if not who.admin and user not in (None, who.user) else of(col, past)

    wq = select(QueuedJob).where(QueuedJob.status == QueueStatus.QUEUED,
                                 of(QueuedJob.user, live))
    lq = select(QueuedJob).where(QueuedJob.status.not_in((QueueStatus.QUEUED,
                                                          QueueStatus.STARTED)),
                                 history(QueuedJob.user)) \
        .order_by(QueuedJob.left_at.desc()).limit(limit)
    jq = select(Job, Cluster).join(Cluster, Cluster.id == Job.cluster_id) \
        .where((Job.status.in_(jobs.ACTIVE) & of(Job.user, live)) | history(Job.user)) \
        .order_by(Job.id.desc()).limit(limit)
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
    if who.admin:
        return rows + ended
    return [r if r["user"] == who.user else masked(r) for r in rows + ended]
