"""A heal on an engine that allocates: after a run lost nodes (or its allocation ended), give
the allocation back and ask the engine again, by `backends.alloc.heal_shapes`: the same size
without the lost nodes (a replacement at once, rather than the engine's own requeue, which
waits out its delay), failing that the nodes left. A failure that lost no node keeps it, and
so does one whose lost nodes the cluster's spares in the same allocation replace (`--spares`).

Beside `engine_alloc` rather than in it: this records the new grant through
`lifecycle.clusters`, which itself imports `engine_alloc` to release an allocation on stop.
"""

from __future__ import annotations

import time

from gpufleet.backends.alloc import Allocating, Granted, heal_shapes
from gpufleet.errors import AllocationError
from gpufleet.lifecycle import clusters, engine_alloc, spares
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Store

HEAL_WAIT_S = 600.0  # how long a heal waits in the engine's queue for a new allocation
SPARES_WAIT_S = 30.0  # ...for one that also holds the spares again: the job comes first


def reallocate(store: Store, engine: Allocating, cluster: Cluster, lost: set[str],
               say: engine_alloc.Say,
               wait_s: float = HEAL_WAIT_S) -> tuple[Cluster, list[str]]:
    """The cluster after the heal, and the notes that say what happened ([]: kept as it
    was). `lost`: the nodes the backend says the run lost; nodes the engine shows unhealthy
    count too. An AllocationError when the engine grants no shape within `wait_s` each."""
    c = cluster
    mine = {p.node_id for p in clusters.placements(store, c)}
    bad = (lost | {n.id for n in engine.discover() if not n.healthy}) & mine or lost
    now = engine.state(c.engine_ref) if c.engine_ref else None
    if not bad and isinstance(now, Granted):
        return c, []  # a failure that lost no node: the next run uses the same allocation
    word, gone = engine.alloc_word, ", ".join(sorted(bad))
    if c.spares and isinstance(now, Granted):  # spares in the allocation, which outlived it
        promoted = spares.promote(store, c, bad, {name for name, _ in now.grants})
        if promoted is not None:
            healed, notes = promoted
            return healed, [*notes, f"{word} {c.engine_ref} kept: no new allocation, no wait "
                            f"in {engine.engine_name}'s queue; no new spare until a heal asks "
                            f"{engine.engine_name} for a new allocation"]
    old = c.engine_ref or "?"
    if c.engine_ref:
        engine.cancel(c.engine_ref)
    limit = ClusterSpec.model_validate_json(c.spec_json).time_limit_s
    left = None if limit is None else max(60.0, limit - (time.time() - (c.started_at or 0)))
    per = c.count // c.nodes
    # the spares again with the full size, then the full size alone, then fewer nodes
    shapes = [(want, 0) for want in heal_shapes(c.nodes, len(bad))]
    if spares.wanted(c):
        shapes.insert(0, (c.nodes, spares.wanted(c)))
    for i, (want, extra) in enumerate(shapes):
        try:
            got = engine_alloc.grant(engine, c.name, c.gpu, per * want, want, c.network, left,
                                     say, c.user or "", exclude=tuple(sorted(bad)),
                                     deadline_s=min(wait_s, SPARES_WAIT_S) if extra else wait_s,
                                     spares=extra)
        except AllocationError as exc:
            if i + 1 < len(shapes):
                continue
            raise AllocationError(f"node(s) {gone} lost and {engine.engine_name} gives no new "
                                  f"allocation: {exc}") from None
        try:
            healed = clusters.regrant(store, c.id, got.nodes, got.ref, spares=extra)
        except BaseException:
            engine.cancel(got.ref)
            raise
        fewer = "" if want == c.nodes else f"; going on with {want} node(s)"
        return healed, [f"node(s) {gone} lost with {word} {old}; new allocation: {word} "
                        f"{got.ref} on {', '.join(n.id for n in got.nodes)} (replacement "
                        f"nodes, not {engine.engine_name}'s requeue){fewer}"]
    return c, []
