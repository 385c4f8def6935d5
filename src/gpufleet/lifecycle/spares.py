"""A cluster's lost nodes replaced, spare nodes first (`--spares N`).

A spare is a whole free node of the cluster's type and fabric, held beside the cluster's own
from its launch (its reservation rows have `spare` set), billed with the cluster, and warmed by
every run on an SSH pool (its workdir shipped, its setup run, its image pulled:
backends/ssh_run.py). When a node is lost the heal makes a spare one of the cluster's in the
same write transaction, so the next run starts at once on a node nobody else could take and
that already holds what the job needs; then it reserves a new spare from the free nodes, which
the next run warms. With no spare left a free node is reserved as before; with none free the
job goes on with the healthy nodes alone. Spares that could not be made up are tried again at
the next heal, not before.

On an engine that allocates (Slurm) the spares are nodes of the cluster's own allocation, which
outlives the failure of one of its nodes (`--no-kill`): `promote` makes spares the cluster's in
place of the lost nodes, with no new allocation and so no wait in the engine's queue; the
allocation cannot grow, so no new spare is taken until a heal asks the engine again
(lifecycle/engine_heal.py).
"""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.errors import AllocationError
from gpufleet.lifecycle import clusters
from gpufleet.pool.allocate import allocate
from gpufleet.pool.model import Node
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Reservation, Store


def wanted(cluster: Cluster) -> int:
    """The spare nodes the cluster was launched with (`--spares`; 0 for a row from before)."""
    try:
        return ClusterSpec.model_validate_json(cluster.spec_json).spares
    except ValueError:
        return 0


def heal(store: Store, cluster: Cluster, nodes: list[Node]) -> tuple[Cluster, list[str]]:
    """Replace the cluster's lost or unhealthy nodes (`nodes`: the pool as its engine sees it
    now) with its spare nodes first, then with free whole nodes of its type and fabric, keeping
    the healthy ones; with no replacement, go on with the healthy nodes alone. Lost spares are
    let go, and spares used are made up from the free nodes where there are some. Billed for
    what it holds from now on. Returns the cluster and one line per change, for the job's
    events."""
    by_id = {n.id: n for n in nodes}
    notes: list[str] = []
    with store.session() as s:
        c, mine, spare = _held(s, cluster)

        def lost(nid: str) -> bool:
            return nid not in by_id or not by_id[nid].healthy

        bad = [nid for nid in mine if lost(nid)]
        bad_spares = [nid for nid in spare if lost(nid)]
        if not bad and not bad_spares:
            return c, notes
        per = len(next(iter(mine.values())))
        billed_before = (len(mine) + len(spare)) * per
        whole = c.nodes > 1 or bool(spare) or wanted(c) > 0  # as the launch took them
        reserved = clusters.held(s, c.pool)
        exclusive = clusters.held_whole(s, c.pool)

        def let_go(rows: list[Reservation]) -> None:
            for r in rows:
                s.delete(r)
                reserved.pop((r.node_id, r.device_id), None)
            exclusive.pop(rows[0].node_id, None)

        def take_free(spare_row: bool) -> str:
            """A whole free node like the others reserved (AllocationError: none is free); how
            the note names it."""
            got = allocate(c.gpu, per, 1, c.network,
                           [n for n in nodes if n.id not in mine and n.id not in spare],
                           reserved, exclusive, price=clusters.price_per_gpu, whole=whole)
            p = got.placements[0]
            rows = clusters.reservation_rows(c, [p], spare=spare_row)
            s.add_all(rows)
            for d in p.devices:
                reserved[(p.node_id, d.id)] = c.name
            exclusive[p.node_id] = c.name
            (spare if spare_row else mine)[p.node_id] = rows
            return f"{p.node_id} ({p.address})"

        for nid in bad_spares:
            let_go(spare.pop(nid))
            notes.append(f"spare node {nid} lost; let go")
        for nid in bad:
            let_go(mine.pop(nid))
            if spare:  # a spare first: held, and warmed by the runs before
                notes.append(_use_spare(mine, spare, nid, next(iter(spare))))
                continue
            try:
                notes.append(f"node {nid} lost; replaced by node {take_free(False)}")
            except AllocationError as exc:
                notes.append(f"node {nid} lost; no replacement ({exc}); going on with "
                             f"{len(mine)} node(s)")
        if not mine:
            raise AllocationError(f"cluster: every node of {c.name} is lost and none is free "
                                  "to replace them")
        for _ in range(wanted(c) - len(spare)):
            try:
                notes.append(f"new spare node {take_free(True)} reserved; the next run warms it")
            except AllocationError as exc:
                notes.append(f"no free node for a new spare ({exc}); {len(spare)} spare "
                             "node(s) left")
                break
        _settle(c, mine, spare, per, billed_before)
        return c, notes


def promote(store: Store, cluster: Cluster, lost: set[str],
            alive: set[str]) -> tuple[Cluster, list[str]] | None:
    """Replace the cluster's `lost` nodes by its spare nodes still in its allocation (`alive`:
    the nodes the engine grants it now), in one write transaction; spares not in `alive` are
    let go. None, changing nothing, when fewer spares are alive than nodes were lost. Billed
    for what it holds from now on. Returns the cluster and one line per change."""
    with store.session() as s:
        c, mine, spare = _held(s, cluster)
        bad = sorted(nid for nid in mine if nid in lost or nid not in alive)
        usable = sorted(nid for nid in spare if nid in alive and nid not in lost)
        if not bad or len(usable) < len(bad):
            return None
        per = len(next(iter(mine.values())))
        billed_before = (len(mine) + len(spare)) * per
        notes = []
        for sid in sorted(set(spare) - set(usable)):
            for r in spare.pop(sid):
                s.delete(r)
            notes.append(f"spare node {sid} lost; let go")
        for nid, sid in zip(bad, usable, strict=False):
            for r in mine.pop(nid):
                s.delete(r)
            notes.append(_use_spare(mine, spare, nid, sid))
        _settle(c, mine, spare, per, billed_before)
        return c, notes


Rows = dict[str, list[Reservation]]  # node id -> its reservation rows


def _held(s: Session, cluster: Cluster) -> tuple[Cluster, Rows, Rows]:
    """The cluster as this transaction sees it, with its own nodes' rows and its spares'."""
    c = s.get(Cluster, cluster.id)
    assert c is not None
    mine: Rows = {}
    spare: Rows = {}
    for r in s.scalars(select(Reservation).where(Reservation.cluster_id == c.id)
                       .order_by(Reservation.node_id, Reservation.device_index)).all():
        (spare if r.spare else mine).setdefault(r.node_id, []).append(r)
    return c, mine, spare


def _use_spare(mine: Rows, spare: Rows, lost: str, sid: str) -> str:
    """Spare `sid` becomes one of the cluster's nodes in place of `lost`; the event's line."""
    rows = spare.pop(sid)
    for r in rows:
        r.spare = False
    mine[sid] = rows
    return f"node {lost} lost; replaced by spare node {sid} ({rows[0].address})"


def _settle(c: Cluster, mine: Rows, spare: Rows, per: int, billed_before: int) -> None:
    """Billed for what the cluster holds from now on; its counts as held."""
    billed = (len(mine) + len(spare)) * per
    if billed != billed_before:
        clusters.rebill(c, billed, time.time())
    c.nodes, c.spares = len(mine), len(spare)
    c.count = c.nodes * per
