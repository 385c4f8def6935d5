"""Clusters through the server, /api/v1/clusters: launch one on a pool as the caller, list the
running ones, stop one.

A launch goes through `lifecycle.provision` exactly as `gpufleet launch` does (the pool
resolved the same way, the same refusals, the reservation in one serialized store
transaction), with the caller recorded as the cluster's owner. A user sees and stops their own
clusters (those they launched, and those made for their jobs); an admin everyone's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.errors import ConflictError, ForbiddenError, LimitError, NotFoundError
from gpufleet.lifecycle import accounts, clusters, held, runs
from gpufleet.lifecycle.provision import provision, with_pool
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Store
from gpufleet.views import cluster_dicts

if TYPE_CHECKING:
    from gpufleet.server.api import Ctx


class ClusterIn(BaseModel):
    spec: dict[str, Any]  # a ClusterSpec as data: {"gpu": "H100", "count": 8, "pool": "sim"}
    cpu_slots: int | None = Field(None, ge=1, le=1024)  # this host's CPU slots, as --cpu-slots


def rows(store: Store, found: list[Cluster], now: float) -> list[dict[str, Any]]:
    """Clusters as the API shows them: the dashboard's fields, the owner, and the devices by
    node (`placements`: node -> device ids), read in a few queries however many there are."""
    placed = clusters.placements_of(store, found)
    return [{**info, "pool": c.pool or "local", "user": c.user, "simulated": bool(c.simulated),
             "for_job": c.for_job, "created_at": c.created_at,
             "placements": {p.node_id: [d.id for d in p.devices] for p in placed[c.id]}}
            for c, info in zip(found, cluster_dicts(store, found, now, placed), strict=True)]


def add_routes(app: FastAPI, ctx: Ctx) -> None:
    store = ctx.store

    @app.post("/api/v1/clusters")
    def launch(body: ClusterIn, request: Request) -> dict[str, Any]:
        me = ctx.who(request)
        spec = ClusterSpec.parse(with_pool(store, body.spec))

        def audited(s: Session, c: Cluster) -> None:  # in the launch's own transaction
            if me.team is not None:  # a launched cluster counts against the team's quota
                s.flush()
                cap = accounts.quotas(s).get((me.team, c.gpu))
                holds = held.by_team(s).get((me.team, c.gpu), 0)
                if cap is not None and holds > cap:
                    raise LimitError(f"limits: team {me.team}'s quota is {cap} x {c.gpu} at "
                                     f"once and {holds - c.count} are in use")
            accounts.audit(s, me, "launch", c.name, f"{c.count} x {c.gpu} on {c.pool or 'local'}")

        # no one to show a quote to: what it reserves is the caller's (simulated: billed nothing)
        made = provision(store, spec, None, body.cpu_slots, user=me.user, then=audited)
        now = time.time()
        return rows(store, [made], now)[0]

    @app.get("/api/v1/clusters")
    def running(request: Request, user: str | None = None) -> list[dict[str, Any]]:
        me = ctx.who(request)
        if user is not None and not me.admin and user != me.user:
            raise ForbiddenError(f"user: only an admin may list {user}'s clusters")
        q = select(Cluster).where(Cluster.status.in_(clusters.ACTIVE)).order_by(Cluster.id)
        if not me.admin or user is not None:
            q = q.where(Cluster.user == (user or me.user))
        with store.read() as s:
            found = list(s.scalars(q))
        now = time.time()
        return rows(store, found, now)

    @app.delete("/api/v1/clusters/{name}")
    def stop(name: str, request: Request) -> dict[str, Any]:
        me = ctx.who(request)
        try:
            c = clusters.get(store, name)  # the running one of that name, else the latest
        except NotFoundError:
            if me.admin:
                raise  # it names the running clusters: everyone's are an admin's to see
            raise NotFoundError(f"cluster: no cluster named '{name}' (GET /api/v1/clusters "
                                "lists yours)") from None
        with accounts.refusals_audited(store, me, "stop", name):
            accounts.may_act_on(me, c.user, f"stop {name}")
        if c.status not in clusters.ACTIVE:
            raise ConflictError(f"cluster: '{name}' is {c.status}, not running")
        with store.session() as s:
            accounts.audit(s, me, "stop", name, f"cluster of {c.user or 'nobody known'}")
        ended, spent = runs.stop_cluster(store, c)
        ctx.wake()  # its devices are free: a queued job may start on them
        return {"name": ended.name, "status": ended.status, "cost_usd": spent}
