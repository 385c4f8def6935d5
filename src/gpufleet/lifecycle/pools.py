"""Pools: where clusters are carved from. This host (`local`, always there), Ray clusters and
synthetic pools, kept in the store with one of them the default for `launch` and `run`.

Like clusters.py, this is the store side; discovery and processes are the backends' business.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from gpufleet.backends.adders import check_address as check_address  # `pool add ray` checks it
from gpufleet.backends.base import Backend
from gpufleet.backends.registry import open_backend, where
from gpufleet.errors import ConflictError, GpufleetError, NotFoundError, SpecError
from gpufleet.lifecycle import clusters
from gpufleet.slot_words import network_shown
from gpufleet.spec import check_name
from gpufleet.status import CLUSTER_ACTIVE
from gpufleet.store import Cluster, Pool, Store, gpufleet_home

LOCAL = "local"
def all_pools(store: Store) -> list[Pool]:
    with store.read() as s:
        return list(s.scalars(select(Pool).order_by(Pool.id)).all())


def default_name(store: Store) -> str:
    with store.read() as s:
        name = s.scalar(select(Pool.name).where(Pool.is_default.is_(True)))
    return name or LOCAL


def get(store: Store, name: str) -> Pool:
    with store.read() as s:
        pool = s.scalar(select(Pool).where(Pool.name == name))
    if pool is None:
        known = ", ".join([LOCAL, *(p.name for p in all_pools(store))])
        raise NotFoundError(f"pool: no pool named '{name}' (pools: {known}; add one with "
                            "gpufleet pool add ray --address HOST:PORT)")
    return pool


def resolve(store: Store, name: str | None, backend: str | None = None) -> Pool | None:
    """The pool a command means: named, else the only pool of the asked backend kind, else the
    default. None is this host."""
    if name is not None:
        return None if name == LOCAL else get(store, name)
    if backend is not None and backend != LOCAL:
        kind = [p for p in all_pools(store) if p.kind == backend]
        if len(kind) != 1:
            names = ", ".join(p.name for p in kind) or "none"
            raise SpecError([("backend", f"{len(kind)} {backend} pools ({names}); name one "
                              "with --pool")])
        return kind[0]
    if backend == LOCAL:
        return None
    default = default_name(store)
    return None if default == LOCAL else get(store, default)


def check_free_name(store: Store, name: str) -> None:
    check_name_field(name)
    if name == LOCAL:
        raise ConflictError("name: 'local' is this host's own pool; pick another name")
    with store.read() as s:
        if s.scalar(select(Pool).where(Pool.name == name)) is not None:
            raise ConflictError(f"name: a pool named '{name}' already exists (gpufleet pool "
                                f"remove {name} first)")


def check_name_field(name: str) -> str:
    try:
        return check_name(name, "pool")
    except ValueError as exc:
        raise SpecError([("name", str(exc))]) from None


def add(store: Store, name: str, kind: str, address: str | None, spec: dict[str, Any],
        make_default: bool, managed: bool = False) -> Pool:
    check_free_name(store, name)
    with store.session() as s:
        if make_default:
            for p in s.scalars(select(Pool).where(Pool.is_default.is_(True))).all():
                p.is_default = False
        pool = Pool(name=name, kind=kind, address=address, spec_json=json.dumps(spec),
                    created_at=time.time(), is_default=make_default, managed=managed)
        s.add(pool)
    return pool


def use(store: Store, name: str) -> None:
    if name != LOCAL:
        get(store, name)
    with store.session() as s:
        for p in s.scalars(select(Pool)).all():
            p.is_default = p.name == name


def active_clusters(store: Store, name: str) -> list[str]:
    with store.read() as s:
        return list(s.scalars(select(Cluster.name).where(
            Cluster.pool == name, Cluster.status.in_(CLUSTER_ACTIVE))).all())


def remove(store: Store, name: str) -> Pool:
    """Forget a pool; refused while clusters hold its devices (stop them first)."""
    pool = get(store, name)
    held = active_clusters(store, name)
    if held:
        raise ConflictError(f"pool: '{name}' still has running cluster(s) {', '.join(held)}; "
                            f"stop them first (gpufleet stop {held[0]})")
    with store.session() as s:
        row = s.get(Pool, pool.id)
        if row is not None:
            s.delete(row)
    path = token_path(pool)
    if path is not None and not pool.managed:  # a managed pool's goes when its Ray stops
        from gpufleet.backends import ray_auth

        ray_auth.forget(path)
    known = json.loads(pool.spec_json or "{}").get("known_hosts")
    if known:  # an SSH pool's pinned host keys
        from gpufleet.backends import ssh_keys

        ssh_keys.forget(Path(known))
    return pool


def backend_for(pool: Pool | None, cpu_slots: int | None = None) -> Backend:
    """The backend object that discovers the pool's nodes (and starts processes on them)."""
    if pool is None:
        return open_backend("local", LOCAL, None, None, cpu_slots, gpufleet_home())
    return open_backend(pool.kind, pool.name, pool.address, pool.spec_json)


def token_path(pool: Pool) -> Path | None:
    """The pool's copy of its Ray cluster's token (None: that cluster needs none)."""
    token = json.loads(pool.spec_json or "{}").get("token_file")
    return Path(token) if token else None


def pool_of(store: Store, cluster: Cluster) -> Pool | None:
    return None if not cluster.pool or cluster.pool == LOCAL else get(store, cluster.pool)


def held_on(store: Store, pool: str | None) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """(device reservations, nodes held whole) on one pool."""
    with store.read() as s:
        return clusters.held(s, pool), clusters.held_whole(s, pool)


def node_rows(nodes: list[Any], held: dict[tuple[str, str], str],
              whole: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per node for `pool list`: what it offers, what is free, who holds the rest (a
    node held whole by a multi-node cluster has nothing free; a device the engine gave to work
    outside gpufleet is not free either), and the engine's own word for the node's state."""
    whole = whole or {}
    rows = []
    for n in nodes:
        kinds = sorted({d.gpu for d in n.devices}) or ["-"]
        for gpu in kinds:
            devs = [d for d in n.devices if d.gpu == gpu]
            holders = sorted({held[(n.id, d.id)] for d in devs if (n.id, d.id) in held})
            free = sum(1 for d in devs if d.healthy and not d.busy and (n.id, d.id) not in held)
            if n.id in whole:
                free = 0
                holders = sorted({*holders, whole[n.id]})
            rows.append({
                "node": n.id, "address": n.address, "gpu": gpu, "count": len(devs),
                "free": free if n.healthy else 0,
                "memory_gb": round(max((d.memory_bytes for d in devs), default=0) / 1e9, 1),
                "fabric": network_shown(gpu, n.fabric_for(gpu)), "network": n.inter_fabric or "-",
                "health": "ok" if n.healthy and all(d.healthy for d in devs) else
                ("lost" if not n.healthy else "unhealthy devices"),
                "simulated": any(d.simulated for d in devs), "held_by": holders,
                **({"state": n.state} if n.state else {}),
            })
    return rows


def listing(store: Store, name: str | None = None) -> list[dict[str, Any]]:
    """`pool list --json`, here or through a server: each pool asked for (every one, this host
    first) with its kind, where it is, whether it is the default, and its `node_rows`, or the
    one-line error that kept its nodes from being read."""
    default = default_name(store)
    chosen = [None, *all_pools(store)] if name is None else [None if name == LOCAL
                                                              else get(store, name)]
    found: list[dict[str, Any]] = []
    for p in chosen:
        pname = p.name if p else LOCAL
        image = json.loads(p.spec_json or "{}").get("image") if p else None
        head = {"pool": pname, "kind": p.kind if p else "local", "where": _where(p),
                "default": pname == default, "image": image}
        try:
            nodes = backend_for(p).discover()
        except GpufleetError as exc:
            found.append({**head, "error": str(exc)})
            continue
        found.append({**head, "nodes": node_rows(nodes, *held_on(store, p.name if p else None))})
    return found


def _where(p: Pool | None) -> str:
    return "this host" if p is None else where(p.kind, p.address, p.spec_json)


def grouped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of alike nodes summed, for pools too large to list node by node."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = (r["gpu"], r["count"], r["fabric"], r["network"], r["health"], r["simulated"])
        g = out.setdefault(key, {**r, "node": "", "nodes": 0, "count": 0, "free": 0,
                                 "held_by": set(), "address": "-"})
        g["nodes"] += 1
        g["count"] += r["count"]
        g["free"] += r["free"]
        g["held_by"] |= set(r["held_by"])
    for g in out.values():
        g["node"] = f"{g['nodes']} nodes"
        g["held_by"] = sorted(g["held_by"])
    return list(out.values())
