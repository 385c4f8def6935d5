"""A heal on an engine that allocates: after a run lost nodes (or its allocation ended), give
the allocation back and ask the engine again, by `backends.alloc.heal_shapes`: the same size
without the lost nodes (a replacement at once, rather than the engine's own requeue, which
waits out its delay), failing that the nodes left. A failure that lost no node keeps it.

Beside `engine_alloc` rather than in it: this records the new grant through
`lifecycle.clusters`, which itself imports `engine_alloc` to release an allocation on stop.
"""

from __future__ import annotations

import time

from gpufleet.backends.alloc import Allocating, Granted, heal_shapes
from gpufleet.errors import AllocationError
from gpufleet.lifecycle import clusters, engine_alloc
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Store

HEAL_WAIT_S = 600.0  # how long a heal waits in the engine's queue for a new allocation


def reallocate(store: Store, engine: Allocating, cluster: Cluster, lost: set[str],
               say: engine_alloc.Say,
               wait_s: float = HEAL_WAIT_S) -> tuple[Cluster, list[str]]:
    """The cluster after the heal, and the notes that say what happened ([]: kept as it
    was). `lost`: the nodes the backend says the run lost; nodes the engine shows unhealthy
    count too. An AllocationError when the engine grants no shape within `wait_s` each."""
    c = cluster
    mine = {p.node_id for p in clusters.placements(store, c)}
    bad = (lost | {n.id for n in engine.discover() if not n.healthy}) & mine or lost
    if not bad and c.engine_ref and isinstance(engine.state(c.engine_ref), Granted):
        return c, []  # a failure that lost no node: the next run uses the same allocation
    old = c.engine_ref or "?"
    if c.engine_ref:
        engine.cancel(c.engine_ref)
    limit = ClusterSpec.model_validate_json(c.spec_json).time_limit_s
    left = None if limit is None else max(60.0, limit - (time.time() - (c.started_at or 0)))
    per = c.count // c.nodes
    shapes = heal_shapes(c.nodes, len(bad))
    word, gone = engine.alloc_word, ", ".join(sorted(bad))
    for i, want in enumerate(shapes):
        try:
            got = engine_alloc.grant(engine, c.name, c.gpu, per * want, want, c.network, left,
                                     say, c.user or "", exclude=tuple(sorted(bad)),
                                     deadline_s=wait_s)
        except AllocationError as exc:
            if i + 1 < len(shapes):
                continue
            raise AllocationError(f"node(s) {gone} lost and {engine.engine_name} gives no new "
                                  f"allocation: {exc}") from None
        try:
            healed = clusters.regrant(store, c.id, got.nodes, got.ref)
        except BaseException:
            engine.cancel(got.ref)
            raise
        fewer = "" if want == c.nodes else f"; going on with {want} node(s)"
        return healed, [f"node(s) {gone} lost with {word} {old}; new allocation: {word} "
                        f"{got.ref} on {', '.join(n.id for n in got.nodes)} (replacement "
                        f"nodes, not {engine.engine_name}'s requeue){fewer}"]
    return c, []
