"""What `list`, `status`, the dashboard and `/metrics` show of clusters and jobs, read from the
store.

Every figure comes from the same functions the terminal uses (`supervise.view.job_view`,
`plan.cost`), so the page, the CLI and Prometheus agree to the cent. It lives outside `web/` so
the CLI reads it without the web server's modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select

from gpufleet import cluster_row, durable_copy
from gpufleet.errors import GpufleetError, NotFoundError
from gpufleet.lifecycle import clusters, jobs, pools, reconcile
from gpufleet.pool.model import Node, Placement
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Event, Job, Store
from gpufleet.supervise import timeline
from gpufleet.supervise.view import JobView, job_view
from gpufleet.telemetry import records


def cluster_dict(store: Store, c: Cluster, now: float) -> dict[str, Any]:
    return cluster_dicts(store, [c], now)[0]


def _newest_jobs(store: Store, found: list[Cluster]) -> dict[int, tuple[str, str]]:
    """Each cluster's newest job's (name, status), in one query per 500 clusters."""
    newest: dict[int, tuple[str, str]] = {}
    ids = [c.id for c in found]
    with store.read() as s:
        for at in range(0, len(ids), 500):
            latest = (select(func.max(Job.id)).where(Job.cluster_id.in_(ids[at:at + 500]))
                      .group_by(Job.cluster_id))
            for cid, name, status in s.execute(select(Job.cluster_id, Job.name, Job.status)
                                               .where(Job.id.in_(latest))):
                newest[cid] = (name, status)
    return newest


def _by_node(found: list[Placement]) -> dict[str, list[str]]:
    return {p.node_id: [d.id for d in p.devices] for p in found}


def cluster_dicts(store: Store, found: list[Cluster], now: float) -> list[dict[str, Any]]:
    """`cluster_row.summary` of each cluster (the dashboard's), in a few queries for all."""
    placed = clusters.placements_of(store, found)
    newest = _newest_jobs(store, found)
    return [cluster_row.summary(c, _by_node(placed[c.id]), newest.get(c.id), now)
            for c in found]


NodesOf = Callable[[Cluster], list[Node] | None]


def pool_nodes(store: Store, cpu_slots: int | None = None) -> NodesOf:
    """The nodes a running cluster's pool offers now, discovered once per pool however many of
    its clusters are asked about; None when the pool cannot be reached."""
    seen: dict[str | None, list[Node] | None] = {}

    def nodes_of(c: Cluster) -> list[Node] | None:
        if c.pool not in seen:
            try:
                seen[c.pool] = pools.backend_for(pools.pool_of(store, c), cpu_slots).discover()
            except GpufleetError:
                seen[c.pool] = None
        return seen[c.pool]

    return nodes_of


def cluster_rows(store: Store, found: list[Cluster], now: float,
                 nodes_of: NodesOf) -> list[dict[str, Any]]:
    """`cluster_row.row` of each cluster: what `list`, `launch --json` and the server's
    /api/v1/clusters show. A running cluster's health is judged against `nodes_of(cluster)`
    (see `pool_nodes`); a stopped one has none ("-")."""
    placed = clusters.placements_of(store, found)
    spare = clusters.placements_of(store, found, spare=True)
    newest = _newest_jobs(store, found)
    rows = []
    for c in found:
        health = "-"
        if c.status in clusters.ACTIVE:
            nodes = nodes_of(c)
            health = clusters.health(c, placed[c.id], nodes) if nodes is not None \
                else "unknown: pool unreachable"
            lost = [p.node_id for p in spare[c.id] if nodes is not None
                    and not any(n.id == p.node_id and n.healthy for n in nodes)]
            if lost:  # the next heal lets it go; until then the cluster has one spare fewer
                spared = f"spare node(s) {', '.join(lost)} lost"
                health = f"degraded: {spared}" if health == "ok" else f"{health}, {spared}"
        rows.append(cluster_row.row(c, _by_node(placed[c.id]), newest.get(c.id), health, now,
                                    [p.node_id for p in spare[c.id]]))
    return rows


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
    """Jobs newest first, with their view (model state and silence included, as `job_detail`
    has them); `since`: only jobs active or ended after it; `user`: only theirs."""
    q = select(Job, Cluster).join(Cluster, Cluster.id == Job.cluster_id) \
        .order_by(Job.id.desc()).limit(limit)
    if since is not None:
        q = q.where((Job.status.in_(jobs.ACTIVE)) | (Job.ended_at >= since))
    if user is not None:
        q = q.where(Job.user == user)
    with store.read() as s:
        rows = [(row[0], row[1]) for row in s.execute(q)]
        running = [j.id for j, _ in rows if j.status == JobStatus.RUNNING]
        events: dict[int, list[tuple[float, str, str]]] = {}
        for jid, t, kind, reason in s.execute(select(
                Event.job_id, Event.time, Event.kind, Event.reason).where(
                Event.job_id.in_(running)).order_by(Event.time, Event.id)) if running else ():
            events.setdefault(jid, []).append((t, kind, reason or ""))
    started = {jid: timeline.current_start(found) for jid, found in events.items()}
    states = jobs.model_states(store, [j.name for j, _ in rows])
    return [(j, c, job_view(j, c, now, states.get(j.name), run_started_at=started.get(j.id)))
            for j, c in rows]


def job_detail(store: Store, name: str, now: float) -> dict[str, Any]:
    """One job: its view's fields (progress, cost, ETA, projected cost) at the top, then its
    cluster, events, findings, the newest value of every device and rank series, and its
    runs, restarts and chart markers (`supervise.timeline`)."""
    j = reconcile.refresh(store, name)
    with store.read() as s:
        c = s.get(Cluster, j.cluster_id)
    if c is None:
        raise NotFoundError(f"job: '{name}' has no cluster record")
    events = [{"time": e.time, "kind": e.kind, "reason": e.reason}
              for e in jobs.events(store, j.id)]
    lines = timeline.of_rows(events, lambda t: records.rank0_step_at(store, j.name, t))
    view = job_view(j, c, now, jobs.model_state(store, j.name),
                    run_started_at=lines["runs"][-1]["start"] if lines["runs"] else None)
    return {
        **view.as_dict(),
        "now": now,
        "cluster_info": cluster_dict(store, c, now),
        "events": events,
        "durable_copy": durable_copy.of_rows(events),
        "findings": records.findings(store, j.id),
        "latest": records.latest(store, j.name),
        "nodes": records.nodes(store, j.name),
        **lines,
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
