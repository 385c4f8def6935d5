"""Clusters on an engine that allocates (`backends.alloc.Allocating`): ask it for the nodes,
wait while it queues the request (saying why), record exactly what it granted, give it back.

gpufleet does not queue again what the engine queues: a request goes to the engine at once and
waits in the engine's queue with the engine's own pending reason (Slurm's "Resources",
"Priority", "QOSMaxGRESPerUser"), said each time it changes. What no wait can satisfy is
refused without waiting: a request the pool could not hold even if it were empty (checked
here, before anything is submitted), one the engine refuses, or one pending for a reason the
engine says never clears, which is cancelled.

Imports only the store and the engines, so `lifecycle.clusters` can release an allocation on
stop without an import cycle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import select

from gpufleet.backends.alloc import Allocating, Ask, Ended, Granted, Pending
from gpufleet.backends.kinds import capabilities
from gpufleet.backends.registry import open_backend
from gpufleet.errors import AllocationError, GpufleetError
from gpufleet.pool.allocate import allocate
from gpufleet.pool.model import Allocation, Node
from gpufleet.status import JOB_ACTIVE
from gpufleet.store import Cluster, Pool, Store

POLL_S = 1.0  # how often a pending request is looked at...
QUICK_POLL_S, QUICK_FOR_S = 0.2, 5.0  # ...after its first seconds, when most requests start
Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Grant:
    """What the engine granted: its allocation's id, and the nodes with just the granted
    devices (free and healthy: they are ours now)."""

    ref: str
    nodes: list[Node]


def refuse_impossible(gpu: str, count: int, nodes_wanted: int | None, network: str | None,
                      nodes: list[Node], where: str) -> Allocation:
    """An AllocationError when even an empty partition could not hold the request (more GPUs
    than it has, a type it lacks): waiting in Slurm's queue would never end. Otherwise where it
    could go if the partition were empty (for the quote)."""
    empty = [dataclasses.replace(n, healthy=True, devices=tuple(
        dataclasses.replace(d, healthy=True, busy=False) for d in n.devices)) for n in nodes]
    try:
        return allocate(gpu, count, nodes_wanted, network, empty, {}, {},
                        whole=bool(nodes_wanted and nodes_wanted > 1))
    except AllocationError as exc:
        raise AllocationError(f"{exc}; {where} could never hold this even when idle, so it is "
                              "not submitted") from None


def wait_running(engine: Allocating, ref: str, say: Say, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic,
                 deadline_s: float | None = None) -> Granted:
    """Poll the allocation until it is granted; each new pending reason is said once. It is
    cancelled when it can never start, ends without starting, is still pending after
    `deadline_s` (None: no limit), or the wait is interrupted (Ctrl-C)."""
    started = clock()
    try:
        with _term_interrupts():
            return _poll(engine, ref, say, poll_s, clock, deadline_s, started)
    except BaseException:
        engine.cancel(ref)
        raise


@contextlib.contextmanager
def _term_interrupts() -> Iterator[None]:
    """SIGTERM during the wait raises KeyboardInterrupt, so the request is cancelled rather
    than left holding nodes (in the main thread; elsewhere signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _poll(engine: Allocating, ref: str, say: Say, poll_s: float, clock: Callable[[], float],
          deadline_s: float | None, started: float) -> Granted:
    """`wait_running`'s loop: the grant, or an AllocationError."""
    kind, last = engine.kind, Pending("", "")
    while True:
        if deadline_s is not None and clock() - started > deadline_s:
            raise AllocationError(f"{kind}: job {ref} still pending after {deadline_s:.0f} s "
                                  f"({last.text or 'no reason given'})")
        match engine.state(ref):
            case Granted() as granted:
                return granted
            case Ended(state=state):
                raise AllocationError(f"{kind}: job {ref} ended before it started ({state})")
            case Pending() as pending:
                if pending.reason != last.reason and pending.reason:
                    last = pending
                    say(f"{engine.alloc_word} {ref} pending: {pending.text} "
                        f"({clock() - started:.0f} s)")
                if pending.never_clears:
                    raise AllocationError(f"{kind}: job {ref} can never start: {pending.text}")
        time.sleep(QUICK_POLL_S if clock() - started < QUICK_FOR_S else poll_s)


def granted_nodes(engine: Allocating, ref: str, granted: Granted, nodes: list[Node],
                  per_node: int) -> list[Node]:
    """The discovered nodes the engine granted, holding only the granted devices (by index;
    all of the node's when the engine names no index), in allocation order."""
    by_id = {n.id: n for n in nodes}
    out = []
    for name, idx in granted.grants:
        node = by_id.get(name)
        if node is None:
            raise AllocationError(f"{engine.kind}: job {ref} was granted "
                                  f"node {name}, which is not in the pool's {engine.where}")
        chosen = [d for d in node.devices if d.index in idx] if idx else list(node.devices)
        devices = tuple(dataclasses.replace(d, busy=False, healthy=True)
                        for d in sorted(chosen, key=lambda d: d.index)[:per_node])
        out.append(dataclasses.replace(node, devices=devices, healthy=True))
    return out


def grant(engine: Allocating, cluster: str, gpu: str, count: int, nodes_wanted: int | None,
          network: str | None, time_limit_s: float | None, say: Say, user: str = "",
          exclude: tuple[str, ...] = (), deadline_s: float | None = None,
          spares: int = 0) -> Grant:
    """Ask the engine for the nodes (and `spares` whole nodes more like them, in the same
    allocation: the grant's last nodes are for them) and wait until it grants them."""
    nodes = engine.discover()
    left = [n for n in nodes if n.id not in exclude]
    want = nodes_wanted or 1
    refuse_impossible(gpu, count + spares * (count // want),
                      want + spares if spares else nodes_wanted, network, left, engine.where)
    ref, shape = engine.request(Ask(
        cluster, gpu, count, want, time_limit_s, exclude, user,
        network if network in ("infiniband", "ethernet") else None, spares))
    say(f"{engine.alloc_word} {ref} submitted ({shape}"
        f"{', excluding ' + ','.join(exclude) if exclude else ''})")
    granted = wait_running(engine, ref, say, deadline_s=deadline_s)
    try:
        got = granted_nodes(engine, ref, granted, engine.discover(), count // want)
    except BaseException:
        engine.cancel(ref)
        raise
    say(f"{engine.alloc_word} {ref} running on {', '.join(n.id for n in got)}")
    return Grant(ref, got)


def allocator(store: Store, pool_name: str | None) -> Allocating | None:
    """The engine of a stored pool when it allocates (None: the pool is gone, or its engine
    does not allocate), opened the one way (`backends.registry`) without `lifecycle.pools`,
    which would be an import cycle."""
    if not pool_name:
        return None
    with store.read() as s:
        row = s.scalar(select(Pool).where(Pool.name == pool_name))
    if row is None or not capabilities(row.kind).allocates:
        return None
    engine = open_backend(row.kind, row.name, row.address, row.spec_json)
    return engine if isinstance(engine, Allocating) else None


def release(store: Store, cluster: Cluster) -> str | None:
    """Give the cluster's allocation back to its engine; a problem reaching the engine is
    returned as a line to show, not raised: the cluster is stopped either way."""
    if not cluster.engine_ref:
        return None
    engine = None
    try:
        engine = allocator(store, cluster.pool)
        if engine is not None:
            engine.cancel(cluster.engine_ref)
    except GpufleetError as exc:
        word = engine.alloc_word if engine is not None else "allocation"
        return f"could not cancel {word} {cluster.engine_ref}: {exc}"
    return None


def queue_rows(store: Store, rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """`gpufleet jobs` with the engine's own word: each job on a cluster an engine allocated
    gets `allocation` (the engine's name, its allocation's id, state and reason), and the
    allocations gpufleet submitted that the engine still queues (a `run` or `launch` waiting
    for nodes) are listed first, as the engine shows them. Engines that cannot be reached
    are left out."""
    with store.read() as s:
        pools = [p for p in s.scalars(select(Pool).order_by(Pool.id))
                 if capabilities(p.kind).allocates]
        refs = {c.engine_ref: c.name for c in s.scalars(
            select(Cluster).where(Cluster.engine_ref.is_not(None)))}
    by_cluster: dict[str, dict[str, str]] = {}
    pending: list[dict[str, Any]] = []
    for row in pools:
        engine = allocator(store, row.name)
        if engine is None:
            continue
        try:
            queue = engine.queued()
        except GpufleetError:
            continue
        for q in queue:
            info = {"engine": engine.engine_name, "id": q.ref, "state": q.state,
                    "reason": q.reason, "nodes": q.nodes}
            if q.ref in refs:
                by_cluster[refs[q.ref]] = info
            elif q.pending:
                pending.append({"name": f"({row.kind} {q.ref})", "user": None, "team": None,
                                "status": f"pending in {engine.engine_name}", "priority": None,
                                "position": None, "est_start": None, "wait": None,
                                "reason": q.reason, "gpu": "-",
                                "count": 0, "cluster": None, "pool": row.name,
                                "submitted_at": None, "started_at": None, "ended_at": None,
                                "cost_usd": 0.0, "time_limit_s": None, "step": None,
                                "total_steps": None, "allocation": info})
    out = [{**r, "allocation": by_cluster[r["cluster"]]} if r.get("cluster") in by_cluster
           and r["status"] in JOB_ACTIVE else r for r in rows]
    return pending + out
