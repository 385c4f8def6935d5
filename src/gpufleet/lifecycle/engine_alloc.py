"""Clusters on an engine that allocates (Slurm): ask it for the nodes, wait while it queues
the request (saying why), record exactly what it granted, and give it back.

gpufleet does not queue again what the engine queues: a request goes to Slurm at once, and
waits in Slurm's queue with Slurm's own pending reason ("Resources", "Priority",
"QOSMaxGRESPerUser"), printed each time it changes. What no wait can satisfy is refused
without waiting: a request the partition could not hold even if it were empty (checked here,
before anything is submitted), one sbatch refuses, or one Slurm pends for a reason that never
clears (`slurm_parse.NEVER_CLEARS`), which is cancelled.

Imports only the store and the engines, so `lifecycle.clusters` can release an allocation on
stop without an import cycle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select

from gpufleet.backends import slurm_parse
from gpufleet.backends.registry import open_backend
from gpufleet.backends.slurm_cmds import Ask
from gpufleet.errors import AllocationError, GpufleetError
from gpufleet.lifecycle.status import JOB_ACTIVE
from gpufleet.pool.allocate import allocate
from gpufleet.pool.model import Allocation, Node
from gpufleet.store import Cluster, Pool, Store

POLL_S = 1.0  # how often a pending request is looked at...
QUICK_POLL_S, QUICK_FOR_S = 0.2, 5.0  # ...after its first seconds, when most requests start
Say = Callable[[str], None]


class Allocating(Protocol):
    """What an engine that allocates offers besides `Backend` (backends/slurm.py has it)."""

    partition: str | None

    def discover(self) -> list[Node]: ...

    def ask(self, cluster: str, gpu: str, count: int, nodes: int, time_limit_s: float | None,
            exclude: tuple[str, ...] = (), user: str = "",
            network: str | None = None) -> Ask: ...

    def submit(self, ask: Ask) -> str: ...

    def job(self, job_id: str) -> slurm_parse.SlurmJob | None: ...

    def cancel(self, job_id: str) -> None: ...


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


def wait_running(backend: Allocating, ref: str, say: Say, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic,
                 deadline_s: float | None = None) -> slurm_parse.SlurmJob:
    """Poll the job until it runs; each new pending reason is said once. The job is cancelled
    when it can never start, ends without starting, is still pending after `deadline_s` (None:
    no limit), or the wait is interrupted (Ctrl-C)."""
    started, last = clock(), ""
    try:
        with _term_interrupts():
            return _poll(backend, ref, say, poll_s, clock, deadline_s, started, last)
    except BaseException:
        backend.cancel(ref)
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


def _poll(backend: Allocating, ref: str, say: Say, poll_s: float, clock: Callable[[], float],
          deadline_s: float | None, started: float, last: str) -> slurm_parse.SlurmJob:
    """`wait_running`'s loop: the job once it runs, or an AllocationError."""
    while True:
        if deadline_s is not None and clock() - started > deadline_s:
            raise AllocationError(f"slurm: job {ref} still pending after {deadline_s:.0f} s "
                                  f"({slurm_parse.reason_text(last or 'no reason given')})")
        job = backend.job(ref)
        if job is None or job.ended:
            state = job.state if job else "gone from Slurm's queue"
            raise AllocationError(f"slurm: job {ref} ended before it started ({state})")
        if job.running and job.grants:
            return job
        if job.reason != last and job.reason not in ("None", ""):
            last = job.reason
            say(f"Slurm job {ref} pending: {slurm_parse.reason_text(job.reason)} "
                f"({clock() - started:.0f} s)")
        if slurm_parse.never_clears(job.reason):
            raise AllocationError(f"slurm: job {ref} can never start: "
                                  f"{slurm_parse.reason_text(job.reason)}")
        time.sleep(QUICK_POLL_S if clock() - started < QUICK_FOR_S else poll_s)


def granted_nodes(job: slurm_parse.SlurmJob, nodes: list[Node], per_node: int) -> list[Node]:
    """The discovered nodes Slurm gave the job, holding only the granted GPUs (by index; all
    of the node's when Slurm names no index), in allocation order."""
    by_id = {n.id: n for n in nodes}
    out = []
    for name, idx in job.grants:
        node = by_id.get(name)
        if node is None:
            raise AllocationError(f"slurm: job {job.id} was granted node {name}, which is not "
                                  "in the pool's partition")
        chosen = [d for d in node.devices if d.index in idx] if idx else list(node.devices)
        devices = tuple(dataclasses.replace(d, busy=False, healthy=True)
                        for d in sorted(chosen, key=lambda d: d.index)[:per_node])
        out.append(dataclasses.replace(node, devices=devices, healthy=True))
    return out


def grant(backend: Allocating, cluster: str, gpu: str, count: int, nodes_wanted: int | None,
          network: str | None, time_limit_s: float | None, say: Say, user: str = "",
          exclude: tuple[str, ...] = (), deadline_s: float | None = None) -> Grant:
    """Ask the engine for the nodes and wait until it grants them."""
    nodes = backend.discover()
    where = f"partition {backend.partition or '(default)'}"
    left = [n for n in nodes if n.id not in exclude]
    refuse_impossible(gpu, count, nodes_wanted, network, left, where)
    want = nodes_wanted or 1
    ask = backend.ask(cluster, gpu, count, want, time_limit_s, exclude, user,
                      network if network in ("infiniband", "ethernet") else None)
    ref = backend.submit(ask)
    say(f"Slurm job {ref} submitted ({want} node(s) x --gres={ask.gres}"
        f"{', excluding ' + ','.join(exclude) if exclude else ''})")
    job = wait_running(backend, ref, say, deadline_s=deadline_s)
    try:
        got = granted_nodes(job, backend.discover(), count // want)
    except BaseException:
        backend.cancel(ref)
        raise
    say(f"Slurm job {ref} running on {', '.join(n.id for n in got)}")
    return Grant(ref, got)


def pool_backend(store: Store, pool_name: str | None) -> Any:  # a Backend, maybe Allocating
    """The engine of a stored pool, opened without `lifecycle.pools` (no import cycle)."""
    if not pool_name:
        return None
    with store.read() as s:
        row = s.scalar(select(Pool).where(Pool.name == pool_name))
    if row is None:
        return None
    token = json.loads(row.spec_json or "{}").get("token_file")
    return open_backend(row.kind, row.name, row.address, row.spec_json,
                        Path(token) if token else None)


def release(store: Store, cluster: Cluster) -> str | None:
    """Give the cluster's allocation back to its engine (scancel); a problem reaching the
    engine is returned as a line to show, not raised: the cluster is stopped either way."""
    if not cluster.engine_ref:
        return None
    try:
        backend = pool_backend(store, cluster.pool)
        if backend is not None:
            backend.cancel(cluster.engine_ref)
    except GpufleetError as exc:
        return f"could not cancel Slurm job {cluster.engine_ref}: {exc}"
    return None


def queue_rows(store: Store, rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """`gpufleet jobs` with Slurm's own word: each job on a Slurm cluster gets `slurm` (its
    allocation's job id, state and reason from squeue), and the allocations gpufleet submitted
    that Slurm still queues (a `run` or `launch` waiting for nodes) are listed first, as
    Slurm shows them. Pools Slurm cannot be reached for are left as they are."""
    with store.read() as s:
        pools = list(s.scalars(select(Pool).where(Pool.kind == "slurm")))
        refs = {c.engine_ref: c.name for c in s.scalars(
            select(Cluster).where(Cluster.engine_ref.is_not(None)))}
    by_cluster: dict[str, dict[str, str]] = {}
    pending: list[dict[str, Any]] = []
    for row in pools:
        backend = open_backend(row.kind, row.name, row.address, row.spec_json, None)
        try:
            queue = backend.queue()  # type: ignore[attr-defined]
        except GpufleetError:
            continue
        for job_id, (state, reason, nodes) in queue.items():
            info = {"id": job_id, "state": state, "reason": reason, "nodes": nodes}
            if job_id in refs:
                by_cluster[refs[job_id]] = info
            elif state == "PENDING":
                pending.append({"name": f"(slurm {job_id})", "user": None, "team": None,
                                "status": "pending in Slurm", "priority": None,
                                "position": None, "est_start": None, "wait": None,
                                "reason": slurm_parse.reason_text(reason), "gpu": "-",
                                "count": 0, "cluster": None, "pool": row.name,
                                "submitted_at": None, "started_at": None, "ended_at": None,
                                "cost_usd": 0.0, "time_limit_s": None, "step": None,
                                "total_steps": None, "slurm": info})
    out = [{**r, "slurm": by_cluster[r["cluster"]]} if r.get("cluster") in by_cluster and
           r["status"] in JOB_ACTIVE else r for r in rows]
    return pending + out
