"""The allocator index of a pool kept between launches, for a process that launches many (the
team server).

Building an `Allocator` costs a pass over the whole pool (about 12 ms for 2,000 nodes); a server
doing it twice for every POST /clusters spent most of each request there, inside the write
transaction every other writer waits on. So the index of each pool is kept, and brought up to
the store's reservations (`Allocator.sync`, paying for what changed since) each time it is
asked. It is kept only while the pool's backend hands back the very same node list (a sim
pool's, see `backends.registry`): nodes discovered anew (Ray) may differ, and get a new index.
The store stays the truth: every answer is computed from the reservations read in the caller's
transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from gpufleet.pool.allocate import Allocator, Reservations
from gpufleet.pool.model import Allocation, Node

_LOCK = threading.Lock()  # one request at a time moves an index (they are not thread-safe)
_KEPT: dict[str, tuple[list[Node], Allocator]] = {}  # pool -> (the nodes indexed, the index)


def allocate(pool: str, nodes: list[Node], reserved: Reservations,
             exclusive: Mapping[str, str], price: Callable[[str, str], float], gpu: str,
             count: int, nodes_wanted: int | None, network: str | None) -> Allocation:
    """`pool.allocate.allocate(...)`'s answer for these reservations, from the kept index."""
    with _LOCK:
        kept = _KEPT.get(pool)
        if kept is None or kept[0] is not nodes or len(kept[1].nodes) != len(nodes) \
                or not kept[1].sync(reserved, exclusive):
            index = Allocator(nodes, price=price)
            if not index.sync(reserved, exclusive):
                index = Allocator(nodes, reserved, exclusive, price)  # not kept: cannot sync
                return index.allocate(gpu, count, nodes_wanted, network)
            _KEPT[pool] = (nodes, index)
        else:
            index = kept[1]
        return index.allocate(gpu, count, nodes_wanted, network)
