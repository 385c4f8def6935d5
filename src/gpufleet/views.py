"""What `list`, `status`, the dashboard and `/metrics` show of clusters and jobs, read from the
store.

Every figure comes from the same functions the terminal uses (`supervise.view.job_view`,
`plan.cost`), so the page, the CLI and Prometheus agree to the cent. It lives outside `web/` so
the CLI reads it without the web server's modules.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from gpufleet.errors import NotFoundError
from gpufleet.lifecycle import clusters, jobs, reconcile
from gpufleet.plan import cost
from gpufleet.pool.model import Node, Placement
from gpufleet.slot_words import network_shown
from gpufleet.store import Cluster, Job, Store
from gpufleet.supervise import durable
from gpufleet.supervise.view import JobView, job_view
from gpufleet.telemetry import records


def cluster_dict(store: Store, c: Cluster, now: float) -> dict[str, Any]:
    return cluster_dicts(store, [c], now)[0]


def cluster_dicts(store: Store, found: list[Cluster], now: float,
                  placed: dict[int, list[Placement]] | None = None) -> list[dict[str, Any]]:
    """`cluster_dict` of each cluster, with two queries for all of them (not two each);
    `placed`: their `clusters.placements_of`, when the caller has it already."""
    placed = placed if placed is not None else clusters.placements_of(store, found)
    newest: dict[int, tuple[str, str]] = {}  # cluster -> its newest job's (name, status)
    ids = [c.id for c in found]
    with store.read() as s:
        for at in range(0, len(ids), 500):
            latest = (select(func.max(Job.id)).where(Job.cluster_id.in_(ids[at:at + 500]))
                      .group_by(Job.cluster_id))
            for cid, name, status in s.execute(select(Job.cluster_id, Job.name, Job.status)
                                               .where(Job.id.in_(latest))):
                newest[cid] = (name, status)
    return [{
        "name": c.name, "gpu": c.gpu, "count": c.count, "nodes": c.nodes, "network": c.network,
        "devices": clusters.ids_of(placed[c.id]), "status": c.status,
        "price_book": c.price_book, "usd_per_hour": c.usd_per_hour,
        "started_at": c.started_at, "stopped_at": c.stopped_at,
        "cost_usd": cost.accrued_usd(c.usd_per_hour, c.started_at, c.stopped_at, now,
                                     c.banked_usd or 0.0, c.rate_since),
        "job": newest[c.id][0] if c.id in newest else None,
        "job_status": newest[c.id][1] if c.id in newest else None,
    } for c in found]


def cluster_row(store: Store, c: Cluster, now: float, nodes: list[Node] | None) -> dict[str, Any]:
    """`list`'s row of a cluster: what the dashboard shows, plus its health against the devices
    seen now (`nodes` None: the pool could not be reached)."""
    row = cluster_dict(store, c, now)
    health = clusters.health(c, clusters.placements(store, c), nodes) if nodes is not None \
        else "unknown: pool unreachable"
    return {**row, "topology": network_shown(c.gpu, c.network), "age_s": now - c.created_at, "health": health,
            "pool": c.pool or "local", "nodes": c.nodes, "simulated": bool(c.simulated)}


def all_clusters(store: Store, now: float, active_only: bool = False,
                 limit: int = 200, user: str | None = None) -> list[dict[str, Any]]:
    """`user`: only clusters that ran a job of theirs (what a server's user may see)."""
    q = select(Cluster).order_by(Cluster.id.desc()).limit(limit)
    if active_only:
        q = q.where(Cluster.status.in_(clusters.ACTIVE))
    if user is not None:
        q = q.where(Cluster.id.in_(select(Job.cluster_id).where(Job.user == user)))
    with store.read() as s:
        found = list(s.scalars(q))
    return cluster_dicts(store, found, now)


def views(store: Store, now: float, limit: int = 200, since: float | None = None,
          user: str | None = None) -> list[tuple[Job, Cluster, JobView]]:
    """Jobs newest first, with their view; `since`: only jobs active or ended after it;
    `user`: only theirs."""
    q = select(Job, Cluster).join(Cluster, Cluster.id == Job.cluster_id) \
        .order_by(Job.id.desc()).limit(limit)
    if since is not None:
        q = q.where((Job.status.in_(jobs.ACTIVE)) | (Job.ended_at >= since))
    if user is not None:
        q = q.where(Job.user == user)
    with store.read() as s:
        rows = [(row[0], row[1]) for row in s.execute(q)]
    return [(j, c, job_view(j, c, now)) for j, c in rows]


def job_detail(store: Store, name: str, now: float) -> dict[str, Any]:
    """One job: its view's fields (progress, cost, ETA, projected cost) at the top, then its
    cluster, events, findings, and the newest value of every device and rank series."""
    j = reconcile.refresh(store, name)
    with store.read() as s:
        c = s.get(Cluster, j.cluster_id)
    if c is None:
        raise NotFoundError(f"job: '{name}' has no cluster record")
    view = job_view(j, c, now, jobs.model_state(store, j.name))
    events = [{"time": e.time, "kind": e.kind, "reason": e.reason}
              for e in jobs.events(store, j.id)]
    return {
        **view.as_dict(),
        "now": now,
        "cluster_info": cluster_dict(store, c, now),
        "events": events,
        "durable_copy": durable.of_rows(events),
        "findings": records.findings(store, j.id),
        "latest": records.latest(store, j.name),
    }


def job_series(store: Store, name: str, since: float, names: list[str] | None,
               now: float) -> dict[str, Any]:
    jobs.get(store, name)  # NotFoundError for an unknown job
    return {"now": now, "series": records.series(store, name, since, names)}


def check_name(store: Store, name: str) -> None:
    """Refuse a name that is neither a job nor a cluster (what a dashboard can open on)."""
    with store.read() as s:
        found = s.scalar(select(Job.id).where(Job.name == name)) or \
            s.scalar(select(Cluster.id).where(Cluster.name == name))
    if found is None:
        raise NotFoundError(f"name: no cluster or job called '{name}' (see gpufleet list --all)")
