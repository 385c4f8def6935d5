"""Cluster lifecycle on the store: reserve devices, hand out scratch space, release.

A local cluster is a reservation, not a process: its devices are held in the store until it is
stopped, and jobs run on it as supervised process trees.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet import slot_words
from gpufleet.backends.kinds import capabilities
from gpufleet.errors import AllocationError, ConflictError, NotFoundError, SpecError
from gpufleet.lifecycle import engine_alloc, job_runs, owners, pool_index
from gpufleet.lifecycle.say import Say, told
from gpufleet.plan import cost
from gpufleet.pool.allocate import allocate, free_devices
from gpufleet.pool.model import Allocation, Device, Node, Placement
from gpufleet.spec import ClusterSpec
from gpufleet.status import CLUSTER_ACTIVE, JOB_ACTIVE, ClusterStatus
from gpufleet.store import Cluster, Job, Reservation, Store, gpufleet_home

ACTIVE = CLUSTER_ACTIVE


@dataclass(frozen=True)
class Quote:
    rates: list[cost.Rate]
    book: str | None  # the book this cluster will be billed under
    usd_per_hour: float
    simulated: bool = False  # declared devices: quoted for planning, billed nothing


def quote_for(spec: ClusterSpec, network: str | None = None,
              simulated: bool = False) -> Quote:
    """The rates for the spec on `network` (default: the spec's own fabric). Simulated devices
    are quoted, so a plan on a synthetic pool shows what it would cost, but billed at zero."""
    network = network or spec.fabric
    rates = cost.quote(spec.gpu, spec.billed_count, network)  # spare nodes are billed too
    book = spec.price_book or cost.default_book(spec.gpu, spec.billed_count, network)
    if spec.price_book and not any(r.book == spec.price_book for r in rates):
        offered = ", ".join(r.book for r in rates) or "none"
        raise SpecError([("price_book", f"'{spec.price_book}' has no price for {spec.gpu}; "
                          f"books that do: {offered}")])
    chosen = next((r for r in rates if r.book == book), None)
    if simulated:
        return Quote(rates, book, 0.0, simulated=True)
    return Quote(rates, book, chosen.usd_per_hour if chosen else 0.0)


def new_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(2)}"


def held(s: Session, pool: str | None = None) -> dict[tuple[str, str], str]:
    """Reservations on one pool's nodes (node names repeat across pools: every local Ray pool
    has a 'head')."""
    q = (select(Reservation.node_id, Reservation.device_id, Cluster.name)
         .join(Cluster, Cluster.id == Reservation.cluster_id))
    q = q.where(Cluster.pool.is_(None) if pool is None else Cluster.pool == pool)
    return {(nid, did): cname for nid, did, cname in s.execute(q)}  # columns: no ORM objects


def held_whole(s: Session, pool: str | None) -> dict[str, str]:
    """Nodes held whole by a multi-node cluster, or by a cluster with spare nodes (its own
    node and its spares were taken whole) -> that cluster."""
    spared = select(Reservation.cluster_id).where(Reservation.spare.is_(True))
    q = (select(Reservation.node_id, Cluster.name)
         .join(Cluster, Cluster.id == Reservation.cluster_id)
         .where((Cluster.nodes > 1) | Cluster.id.in_(spared)))
    q = q.where(Cluster.pool.is_(None) if pool is None else Cluster.pool == pool)
    return {nid: cname for nid, cname in s.execute(q)}


def price_per_gpu(gpu: str, network: str) -> float:
    """The cheapest catalog rate per GPU-hour, to prefer cheaper node groups; unpriced last."""
    rates = cost.quote(gpu, 1, network)
    return rates[0].usd_per_hour if rates else float("inf")


def network_of(spec: ClusterSpec, alloc: Allocation, nodes: list[Node]) -> str:
    """The fabric the cluster runs over: the one asked for, else what its nodes have (on a
    pool) or PCIe (on this host)."""
    if spec.network:
        return spec.network
    if capabilities(spec.backend).this_host:
        return spec.fabric
    by_id = {n.id: n for n in nodes}
    first = by_id[alloc.placements[0].node_id]
    if len(alloc.placements) - spec.spares > 1:  # spare nodes are not the cluster's fabric
        return first.inter_fabric or "ethernet"
    return first.fabric_for(spec.gpu)


def is_simulated(alloc: Allocation) -> bool:
    return any(d.simulated for p in alloc.placements for d in p.devices)


def _checked(s: Session, spec: ClusterSpec, name: str, nodes: list[Node],
             pool: str | None = None) -> Allocation:
    """Every reason to refuse, in the order a user would fix them; the allocation otherwise."""
    if capabilities(spec.backend).this_host:  # a pool's nodes report no disk here
        free_disk = min((n.free_disk_bytes for n in nodes), default=0)
        if spec.disk_bytes > free_disk:
            raise AllocationError(
                f"disk: the cluster asks for {spec.disk} of scratch space but the node has "
                f"{free_disk / 1e9:.1f} GB free under {gpufleet_home()}"
            )
    if s.scalar(select(Cluster).where(Cluster.name == name, Cluster.status.in_(ACTIVE))):
        raise ConflictError(f"name: a cluster named '{name}' already exists; pick another "
                            f"name or stop it first (gpufleet stop {name})")
    if capabilities(spec.backend).this_host:
        offered = sum(1 for n in nodes for d in n.devices if d.gpu == spec.gpu)
        if slot_words.is_slots(spec.gpu) and spec.count > offered:  # more than it ever could
            raise SpecError([("count", slot_words.beyond_host(spec.count, offered))])
        return allocate(spec.gpu, spec.count, spec.node_count, spec.fabric, nodes, held(s))
    if capabilities(spec.backend).allocates:  # the engine decides: `nodes` is what it granted
        granted = spec.node_count + spec.spares  # spares: granted in the same allocation
        return allocate(spec.gpu, spec.billed_count, granted, spec.network, nodes, {}, {},
                        whole=granted > 1)
    # spare nodes are allocated with the cluster's own, whole nodes of the same type and fabric
    wanted = spec.node_count + spec.spares if spec.spares else spec.nodes
    if pool is None:
        return allocate(spec.gpu, spec.billed_count, wanted, spec.network, nodes, held(s, pool),
                        held_whole(s, pool), price=price_per_gpu)
    return pool_index.allocate(pool, nodes, held(s, pool), held_whole(s, pool), price_per_gpu,
                               spec.gpu, spec.billed_count, wanted, spec.network)


def check(store: Store, spec: ClusterSpec, nodes: list[Node], pool: str | None = None) -> Allocation:
    """Would `launch` succeed now? Raises its error if not; reserves nothing. Returns the
    devices it would get (a dry run shows commands for them). A read: `launch` checks again in
    its own write transaction, so this one need not hold up the other writers."""
    with store.read() as s:
        alloc = _checked(s, spec, spec.name or "", nodes, pool)
    quote_for(spec, network_of(spec, alloc, nodes))
    return alloc


def launch(store: Store, spec: ClusterSpec, nodes: list[Node], for_job: str | None = None,
           pool: str | None = None, user: str | None = None,
           then: Callable[[Session, Cluster], None] | None = None,
           engine_ref: str | None = None) -> Cluster:
    """Allocate devices and record the cluster, all in one serialized write transaction
    (`then`: more for that transaction to write, such as the server's audit event;
    `engine_ref`: the engine's allocation that granted `nodes`, released on stop).

    Names are unique among running clusters; a stopped cluster keeps its name in the history.
    """
    name = spec.name or new_name("cluster")
    scratch_root = gpufleet_home() / "clusters"
    now = time.time()
    owner = owners.me() if for_job else None  # held by this `run` until its supervisor starts
    with store.session() as s:
        while spec.name is None and _running_named(s, name):  # a name we picked: pick again
            name = new_name("cluster")
        alloc = _checked(s, spec, name, nodes, pool)
        network = network_of(spec, alloc, nodes)
        q = quote_for(spec, network, is_simulated(alloc))
        own = alloc.placements[:len(alloc.placements) - spec.spares]
        cluster = Cluster(
            name=name, gpu=spec.gpu, count=spec.count, nodes=len(own), spares=spec.spares,
            network=network, disk_bytes=spec.disk_bytes, backend=spec.backend,
            price_book=None if q.simulated else q.book, usd_per_hour=q.usd_per_hour,
            status=ClusterStatus.RUNNING, created_at=now, started_at=now,
            scratch_dir=str(scratch_root / name),
            spec_json=spec.model_dump_json(), for_job=for_job, pool=pool,
            simulated=q.simulated, owner_pid=owner.pid if owner else None,
            owner_started=owner.started if owner else None, user=user, engine_ref=engine_ref,
        )
        s.add(cluster)
        s.flush()
        s.add_all(reservation_rows(cluster, own))
        s.add_all(reservation_rows(cluster, alloc.placements[len(own):], spare=True))
        if then is not None:
            then(s, cluster)
    Path(cluster.scratch_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    return cluster


def reservation_rows(cluster: Cluster, placements: Iterable[Placement],
                     spare: bool = False) -> list[Reservation]:
    """The rows that hold `placements` for `cluster` (as spare nodes with `spare`), keyed by
    the cluster's own pool: the one way a reservation row is made, so none can miss the pool
    (the unique key that keeps two pools' same-named nodes apart). `cluster` must be flushed
    (it has an id)."""
    return [Reservation(cluster_id=cluster.id, node_id=p.node_id, address=p.address,
                        device_id=d.id, device_index=d.index, pool=cluster.pool or "local",
                        spare=spare)
            for p in placements for d in p.devices]


def check_name_free(store: Store, name: str) -> None:
    """The name check `launch` makes, made early (before an engine is asked for nodes)."""
    with store.read() as s:
        if _running_named(s, name):
            raise ConflictError(f"name: a cluster named '{name}' already exists; pick another "
                                f"name or stop it first (gpufleet stop {name})")


def _running_named(s: Session, name: str) -> bool:
    return s.scalar(select(Cluster.id).where(Cluster.name == name,
                                             Cluster.status.in_(ACTIVE)).limit(1)) is not None


def rebill(c: Cluster, count: int, now: float) -> None:
    """The cluster changes size at `now`: bank the cost at the old rate, then bill `count`."""
    c.banked_usd = cost.accrued_usd(c.usd_per_hour, c.started_at, None, now,
                                    c.banked_usd or 0.0, c.rate_since)
    c.rate_since = now
    rate = cost.cluster_rate(c.gpu, count, c.network, c.price_book) if c.price_book else None
    c.usd_per_hour = rate.usd_per_hour if rate is not None else 0.0


def free_count(store: Store, cluster: Cluster, nodes: list[Node]) -> int:
    """Devices of the cluster's type that nobody holds, on the nodes the cluster is on."""
    with store.read() as s:
        reserved = held(s, cluster.pool)
    mine = {p.node_id for p in placements(store, cluster)}
    return sum(len(free_devices(n, cluster.gpu, reserved)) for n in nodes if n.id in mine)


def resize(store: Store, cluster_id: int, count: int, nodes: list[Node]) -> Cluster:
    """Grow or shrink a one-node cluster's reservation to `count` devices, in one write
    transaction: growing takes the lowest free devices of its type (AllocationError if there
    are too few), shrinking gives back the highest. The cost at the old rate is banked first."""
    now = time.time()
    with store.session() as s:
        c = s.get(Cluster, cluster_id)
        if c is None or c.status not in ACTIVE:
            raise ConflictError(f"cluster: {cluster_id} is not running")
        if c.nodes != 1:
            raise AllocationError(f"count: cluster {c.name} spans {c.nodes} nodes; only one-node "
                                  "clusters change size")
        rows = list(s.scalars(select(Reservation).where(Reservation.cluster_id == c.id,
                                                        Reservation.spare.is_(False))
                              .order_by(Reservation.device_index)).all())
        if count < len(rows):
            for r in rows[count:]:
                s.delete(r)
        elif count > len(rows):
            node = next((n for n in nodes if rows and n.id == rows[0].node_id), None)
            free = free_devices(node, c.gpu, held(s, c.pool)) if node is not None else []
            need = count - len(rows)
            if len(free) < need:
                raise AllocationError(f"count: cluster {c.name} needs {need} more {c.gpu} "
                                      f"device(s) but the node has {len(free)} free")
            grown = Placement(rows[0].node_id, rows[0].address,
                              tuple(sorted(free, key=lambda d: d.index)[:need]))
            s.add_all(reservation_rows(c, [grown]))
        rebill(c, count, now)
        c.count = count
        return c


def get(store: Store, name: str) -> Cluster:
    with store.read() as s:
        # the running cluster of that name, else the latest stopped one
        c = s.scalar(select(Cluster).where(Cluster.name == name)
                     .order_by(Cluster.status.in_(ACTIVE).desc(), Cluster.id.desc()))
        if c is None:
            names = s.scalars(select(Cluster.name).where(Cluster.status.in_(ACTIVE))).all()
            known = ", ".join(names) or "none"
            raise NotFoundError(f"cluster: no cluster named '{name}' (running: {known})")
        return c


def placements(store: Store, cluster: Cluster) -> list[Placement]:
    """The cluster's reserved devices grouped by node, rebuilt from the store alone so a
    detached supervisor needs no view of the pool."""
    return placements_of(store, [cluster])[cluster.id]


def spares(store: Store, cluster: Cluster) -> list[Placement]:
    """The spare nodes the cluster holds beside its own (`--spares`), by node."""
    return placements_of(store, [cluster], spare=True)[cluster.id]


def placements_of(store: Store, found: list[Cluster],
                  spare: bool = False) -> dict[int, list[Placement]]:
    """`placements` of several clusters (by id) in one query, for lists of many (`spare`:
    their spare nodes instead)."""
    by_id = {c.id: c for c in found}
    ids = list(by_id)
    grouped: dict[int, dict[str, list[tuple[str, str, int]]]] = {cid: {} for cid in by_id}
    with store.read() as s:
        for at in range(0, len(ids), 500):  # well under SQLite's limit on query parameters
            for cid, nid, address, did, index in s.execute(  # columns: no ORM objects
                    select(Reservation.cluster_id, Reservation.node_id, Reservation.address,
                           Reservation.device_id, Reservation.device_index)
                    .where(Reservation.cluster_id.in_(ids[at:at + 500]),
                           Reservation.spare.is_(spare))
                    .order_by(Reservation.cluster_id, Reservation.node_id,
                              Reservation.device_index)):
                grouped[cid].setdefault(nid, []).append((address, did, index))
    return {cid: [Placement(nid, rs[0][0], tuple(
        Device(id=did, index=index, gpu=by_id[cid].gpu, memory_bytes=0,
               simulated=bool(by_id[cid].simulated)) for _, did, index in rs))
        for nid, rs in nodes.items()] for cid, nodes in grouped.items()}


def device_ids(store: Store, cluster: Cluster) -> list[str]:
    """The cluster's devices; on several nodes each is named node/device."""
    return ids_of(placements(store, cluster))


def ids_of(found: list[Placement]) -> list[str]:
    if len(found) == 1:
        return [d.id for d in found[0].devices]
    return [f"{p.node_id}/{d.id}" for p in found for d in p.devices]


def stop(store: Store, name: str, reason: str = "stopped by user", cluster_id: int | None = None,
         say: Say | None = None) -> Cluster:
    """Free the devices and freeze the cost (and end any run on it: `job_runs`). Jobs still
    running on it must be stopped first.

    `cluster_id` pins the exact cluster (a job's own), since a name can be reused after a stop.
    `say` hears an engine allocation that could not be released (default: the log).
    """
    with store.session() as s:
        q = select(Cluster).where(Cluster.id == cluster_id) if cluster_id is not None else (
            select(Cluster).where(Cluster.name == name)
            .order_by(Cluster.status.in_(ACTIVE).desc(), Cluster.id.desc()))
        c = s.scalar(q)
        if c is None:
            raise NotFoundError(f"cluster: no cluster named '{name}'")
        if c.status not in ACTIVE:
            return c
        for r in s.scalars(select(Reservation).where(Reservation.cluster_id == c.id)).all():
            s.delete(r)
        c.status = ClusterStatus.STOPPED
        c.stopped_at = time.time()
        job_runs.cluster_stopped(s, c)
    problem = engine_alloc.release(store, c)  # after the store: a stopped cluster holds nothing
    if problem:
        told(say)(f"cluster {c.name}: {problem}")
    shutil.rmtree(c.scratch_dir, ignore_errors=True)
    return c


def regrant(store: Store, cluster_id: int, nodes: list[Node], engine_ref: str,
            spares: int = 0) -> Cluster:
    """The cluster now holds what its engine granted anew (`nodes`, each with just its granted
    devices; the last `spares` of them as spare nodes) under allocation `engine_ref`, in place
    of everything it held; billed for the new size from now if that changed."""
    with store.session() as s:
        c = s.get(Cluster, cluster_id)
        if c is None or c.status not in ACTIVE:
            raise ConflictError(f"cluster: {cluster_id} is not running")
        billed_before = c.billed_devices
        for r in s.scalars(select(Reservation).where(Reservation.cluster_id == c.id)).all():
            s.delete(r)
        s.flush()  # the deletes first: the new grant may hold the same devices again
        own = len(nodes) - spares
        placed = [Placement(n.id, n.address, n.devices) for n in nodes]
        s.add_all(reservation_rows(c, placed[:own]))
        s.add_all(reservation_rows(c, placed[own:], spare=True))
        count = sum(len(n.devices) for n in nodes[:own])
        billed = sum(len(n.devices) for n in nodes)
        if billed != billed_before:
            rebill(c, billed, time.time())
        c.nodes, c.spares, c.count, c.engine_ref = own, spares, count, engine_ref
        return c


def running_job(store: Store, cluster_id: int) -> Job | None:

    with store.read() as s:
        return s.scalar(select(Job).where(Job.cluster_id == cluster_id, Job.status.in_(JOB_ACTIVE)))


def health(cluster: Cluster, reserved: list[Placement], nodes: list[Node]) -> str:
    """'ok', or what is wrong with the cluster's devices as the backend sees them now
    (a GPU gone from NVML, a node lost, a device reported unhealthy)."""
    if cluster.status not in ACTIVE:
        return "-"
    if cluster.gpu == "cpu":
        return "ok"  # CPU slots are a count we chose (--cpu-slots), not devices that can vanish
    by_node = {n.id: n for n in nodes}
    problems = []
    for p in reserved:
        node = by_node.get(p.node_id)
        if node is None or not node.healthy:
            problems.append(f"node {p.node_id} {'lost' if node is None else 'unhealthy'}")
            continue
        seen = {d.id: d for d in node.devices}
        for d in p.devices:
            now = seen.get(d.id)
            if now is None or now.gpu != cluster.gpu:
                problems.append(f"{d.id} missing")
            elif not now.healthy:
                problems.append(f"{d.id} unhealthy")
    return "ok" if not problems else "degraded: " + ", ".join(problems)

