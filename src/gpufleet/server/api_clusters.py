"""Clusters through the server, /api/v1/clusters: launch one on a pool as the caller, list the
running ones (`?all=true`: stopped ones too), stop one; each as the same row `gpufleet list`
makes on this machine (`gpufleet.cluster_row`). And /api/v1/pools: the pools they are carved
from, as `gpufleet pool list` shows them, with other users' clusters unnamed.

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
from gpufleet.lifecycle import accounts, clusters, held, pools, runs
from gpufleet.lifecycle.provision import provision, with_pool
from gpufleet.server import paths
from gpufleet.slot_words import devices_shown
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster
from gpufleet.views import cluster_rows, pool_nodes

if TYPE_CHECKING:
    from gpufleet.server.ctx import Ctx

OTHERS = "another user"  # what a user sees of a device held by a cluster not theirs


class ClusterIn(BaseModel):
    spec: dict[str, Any]  # a ClusterSpec as data: {"gpu": "H100", "count": 8, "pool": "sim"}
    cpu_slots: int | None = Field(None, ge=1, le=1024)  # this host's CPU slots, as --cpu-slots


def unnamed(listed: list[dict[str, Any]], mine: set[str]) -> list[dict[str, Any]]:
    """`pool list` rows with every holder that is not one of `mine` (the caller's clusters)
    shown as OTHERS: a user learns which devices are taken, not what others named theirs."""
    return [{**p, "nodes": [{**n, "held_by": sorted({h if h in mine else OTHERS
                                                     for h in n["held_by"]})}
                            for n in p["nodes"]]} if "nodes" in p else p for p in listed]


def add_routes(app: FastAPI, ctx: Ctx) -> None:
    store = ctx.store

    @app.post(paths.CLUSTERS)
    def launch(body: ClusterIn, request: Request) -> dict[str, Any]:
        me = ctx.who(request)
        spec = ClusterSpec.parse(with_pool(store, body.spec))

        def audited(s: Session, c: Cluster) -> None:  # in the launch's own transaction
            if me.team is not None:  # a launched cluster counts against the team's quota
                s.flush()
                cap = accounts.quotas(s).get((me.team, c.gpu))
                holds = held.by_team(s).get((me.team, c.gpu), 0)
                if cap is not None and holds > cap:
                    raise LimitError(f"limits: team {me.team}'s quota is {devices_shown(c.gpu, cap)} at "
                                     f"once and {holds - c.count} are in use")
            accounts.audit(s, me, "launch", c.name, f"{devices_shown(c.gpu, c.count)} on {c.pool or 'local'}")

        # no one to show a quote to: what it reserves is the caller's (simulated: billed nothing)
        made = provision(store, spec, None, body.cpu_slots, user=me.user, then=audited)
        return cluster_rows(store, [made], time.time(), pool_nodes(store, body.cpu_slots))[0]

    @app.get(paths.CLUSTERS)
    def listed(request: Request, user: str | None = None, all: bool = False
               ) -> list[dict[str, Any]]:
        """The running clusters (`all`: stopped ones too), the caller's or an admin's every."""
        me = ctx.who(request)
        if user is not None and not me.admin and user != me.user:
            raise ForbiddenError(f"user: only an admin may list {user}'s clusters")
        q = select(Cluster).order_by(Cluster.id)
        if not all:
            q = q.where(Cluster.status.in_(clusters.ACTIVE))
        if not me.admin or user is not None:
            q = q.where(Cluster.user == (user or me.user))
        with store.read() as s:
            found = list(s.scalars(q))
        return cluster_rows(store, found, time.time(), pool_nodes(store))

    @app.delete(paths.CLUSTER)
    def stop(name: str, request: Request) -> dict[str, Any]:
        me = ctx.who(request)
        try:
            c = clusters.get(store, name)  # the running one of that name, else the latest
        except NotFoundError:
            if me.admin:
                raise  # it names the running clusters: everyone's are an admin's to see
            raise NotFoundError(f"cluster: no cluster named '{name}' (GET {paths.CLUSTERS} "
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

    @app.get(paths.POOLS)
    def pools_listed(request: Request, name: str | None = None) -> list[dict[str, Any]]:
        """`gpufleet pool list` of the server's pools, where its clusters are carved from."""
        me = ctx.who(request)
        found = pools.listing(store, name)
        if me.admin:
            return found
        with store.read() as s:
            mine = set(s.scalars(select(Cluster.name).where(
                Cluster.user == me.user, Cluster.status.in_(clusters.ACTIVE))))
        return unnamed(found, mine)
