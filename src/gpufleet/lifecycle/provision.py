"""Putting a cluster in place: the pool a spec names, a quote, then the reservation.

The caller decides whether the quote is acceptable (`approve`): the CLI shows it and asks, an
API server can check it against a budget, and both get the same refusals and the same records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from gpufleet.backends.alloc import Allocating
from gpufleet.errors import AllocationError
from gpufleet.lifecycle import clusters, engine_alloc, pools, reconcile
from gpufleet.lifecycle.say import told
from gpufleet.pool.model import Placement
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Store


@dataclass(frozen=True)
class Offer:
    """What launching `spec` would reserve and cost, before anything is reserved."""

    spec: ClusterSpec
    pool: str | None  # None: this host
    network: str
    quote: clusters.Quote


Approve = Callable[[Offer], None]
"""Called with the offer before devices are reserved; raising refuses it."""


def open_store() -> Store:
    """The state file, with jobs whose supervisor died already recorded as ended."""
    store = Store()
    reconcile.reconcile(store)
    return store


def backend_of(store: Store, cluster: Cluster, cpu_slots: int | None = None) -> Any:
    """The backend of the pool the cluster was carved from."""
    return pools.backend_for(pools.pool_of(store, cluster), cpu_slots)


def with_pool(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    """A cluster spec's `pool` and `backend` resolved against the store: the named pool, the
    only pool of the named kind, or the default pool."""
    row = pools.resolve(store, data.get("pool"), data.get("backend"))
    return {**data, "pool": row.name if row else None, "backend": row.kind if row else "local"}


def allocation(store: Store, spec: ClusterSpec,
               cpu_slots: int | None = None) -> tuple[list[Placement], str]:
    """Where the cluster would go and over which fabric, reserving nothing (a dry run)."""
    prow = pools.resolve(store, spec.pool, spec.backend)
    nodes = pools.backend_for(prow, cpu_slots).discover()
    alloc = clusters.check(store, spec, nodes, prow.name if prow else None)
    own = alloc.placements[:len(alloc.placements) - spec.spares]  # not the spare nodes
    return list(own), clusters.network_of(spec, alloc, nodes)


def provision(store: Store, spec: ClusterSpec, approve: Approve | None,
              cpu_slots: int | None = None, for_job: str | None = None, user: str | None = None,
              then: Callable[[Session, Cluster], None] | None = None,
              say: engine_alloc.Say | None = None) -> Cluster:
    """Reserve the devices `spec` asks for, after `approve` accepted the quote. A request the
    pool cannot meet is refused before it is quoted. `approve` None: nobody is shown a quote
    (the server), so there is no dry run first; `launch` checks the same in its transaction.
    `user`: the server's user it is for; `then`: written in the reservation's transaction.
    On an engine that allocates (`backends.alloc.Allocating`) the request waits in the
    engine's queue; `say` hears each change of its pending reason (default: the log, `lifecycle.say`)."""
    pool = pools.resolve(store, spec.pool, spec.backend)
    backend = pools.backend_for(pool, cpu_slots)
    if isinstance(backend, Allocating):
        assert pool is not None  # this host grants nothing
        return _granted(store, spec, approve, backend, pool.name, for_job, user, then,
                        told(say))
    nodes = backend.discover()
    try:
        if approve is not None:
            alloc = clusters.check(store, spec, nodes, pool.name if pool else None)
            network = clusters.network_of(spec, alloc, nodes)
            approve(Offer(spec, pool.name if pool else None, network,
                          clusters.quote_for(spec, network, clusters.is_simulated(alloc))))
        return clusters.launch(store, spec, nodes, for_job=for_job,
                               pool=pool.name if pool else None, user=user, then=then)
    except AllocationError as exc:
        if pool is None:
            raise
        raise AllocationError(f"{exc} [pool {pool.name}; this host's devices: --pool local, or "
                              "gpufleet pool use local]") from None


def _granted(store: Store, spec: ClusterSpec, approve: Approve | None,
             backend: Allocating, pool: str,
             for_job: str | None, user: str | None,
             then: Callable[[Session, Cluster], None] | None, say: engine_alloc.Say) -> Cluster:
    """A cluster the engine allocates: refused at once if the pool could never hold it,
    quoted, submitted, waited for, then recorded as granted (the allocation is cancelled if
    recording fails)."""
    name = spec.name or clusters.new_name("cluster")
    spec = spec.model_copy(update={"name": name})
    clusters.check_name_free(store, name)
    nodes = backend.discover()
    try:
        empty = engine_alloc.refuse_impossible(
            spec.gpu, spec.billed_count, spec.node_count + spec.spares if spec.spares
            else spec.nodes, spec.network, nodes, backend.where)
    except AllocationError as exc:
        spared = f" (the cluster's {spec.node_count} and {spec.spares} spare)" \
            if spec.spares else ""
        raise AllocationError(f"{exc}{spared} [pool {pool}]") from None
    if approve is not None:
        network = clusters.network_of(spec, empty, nodes)
        approve(Offer(spec, pool, network,
                      clusters.quote_for(spec, network, clusters.is_simulated(empty))))
    got = engine_alloc.grant(backend, name, spec.gpu, spec.count, spec.node_count,
                             spec.network, spec.time_limit_s, say, user or "",
                             spares=spec.spares)
    try:
        return clusters.launch(store, spec, got.nodes, for_job=for_job, pool=pool, user=user,
                               then=then, engine_ref=got.ref)
    except BaseException:
        backend.cancel(got.ref)
        raise
