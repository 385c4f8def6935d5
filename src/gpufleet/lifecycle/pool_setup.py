"""Adding pools: naming and recording a pool whose kind checked and probed what the user gave
(each kind's part is its entry in `backends.registry.ENGINES`), starting a local Ray cluster,
and stopping the one gpufleet started when its pool goes.

`lifecycle.pools` keeps the records; this module does what `pool add`, `pool up`, `pool down`
and `pool remove` do around them, so a caller other than the CLI gets the same refusals.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet import catalog
from gpufleet.backends import registry
from gpufleet.backends.adders import AddRequest, HostsAsk
from gpufleet.catalog import GpuType
from gpufleet.errors import ConflictError, SpecError
from gpufleet.lifecycle import pools
from gpufleet.pool.model import FABRIC_LEVEL
from gpufleet.spec_image import check_image
from gpufleet.store import Pool, Store, gpufleet_home
from gpufleet.vocab import INTER_NODE_NETWORKS

if TYPE_CHECKING:
    from gpufleet.backends.ray_local import LocalRay

NODE_NETWORKS = INTER_NODE_NETWORKS


@dataclass(frozen=True)
class Added:
    """A pool just registered, and what it holds."""

    name: str
    nodes: int  # live nodes
    devices: int
    summary: str  # what `pool add` says of it, e.g. "simulated, 1000 nodes, 8000 devices"


def add(store: Store, kind: str, name: str | None, address: str | None, shapes: list[str],
        token_file: Path | None, make_default: bool, partition: str | None = None,
        account: str | None = None, ssh: HostsAsk | None = None,
        image: str | None = None) -> Added:
    """`pool add KIND ...`: the kind's own checks and probe (`backends.adders`), then the
    record; what the probe left (a token's copy) is undone if the record cannot be written.
    `image`: the pool's default image (lifecycle/images.py), kept with its settings."""
    adder = registry.engine(check_kind(kind)).add
    assert adder is not None  # check_kind takes only the kinds with one
    if image is not None:
        try:
            check_image(image)
        except ValueError as exc:
            raise SpecError([("image", str(exc))]) from None
    pool_name = pools.check_name_field(name or kind)
    got = adder(AddRequest(pool_name, address, shapes, token_file, partition, account,
                           gpufleet_home(), lambda: pools.check_free_name(store, pool_name),
                           ssh or HostsAsk()))
    try:
        settings = {**got.settings, **({"image": image} if image else {})}
        pools.add(store, pool_name, kind, got.address, settings, make_default)
    except BaseException:
        got.undo()
        raise
    summary = got.summary + (f", jobs in image {image} unless they name one" if image else "")
    return Added(pool_name, got.nodes, got.devices, summary)


def check_kind(kind: str) -> str:
    """The kind `pool add` was given, refused before the store is opened."""
    if kind not in registry.addable():
        raise SpecError([("kind", f"'{kind}' is not allowed; allowed: "
                          f"{', '.join(registry.addable())} (this host is the built-in pool "
                          "'local')")])
    return kind


def check_local_ray(local: bool, nodes: int, gpu: str, gpus_per_node: int, fabric: str | None,
                    network: str) -> GpuType:
    """Every problem with a `pool up` request at once; the GPU type its nodes declare."""
    problems: list[tuple[str, str]] = []
    if not local:
        problems.append(("local", "only --local is supported: it starts a Ray cluster here; "
                         "for an existing one use gpufleet pool add ray --address HOST:PORT"))
    if not 1 <= nodes <= 16:
        problems.append(("nodes", f"got {nodes}; must be 1 to 16 on one machine"))
    if not 1 <= gpus_per_node <= 8:
        problems.append(("gpus_per_node", f"got {gpus_per_node}; must be 1 to 8"))
    gtype: GpuType | None = None
    try:
        gtype = catalog.resolve_gpu(gpu)
    except SpecError as exc:
        problems += exc.problems
    if fabric is not None and fabric not in FABRIC_LEVEL:
        problems.append(("fabric", f"'{fabric}' is not allowed; allowed: "
                         f"{', '.join(FABRIC_LEVEL)}"))
    if network not in NODE_NETWORKS:
        problems.append(("network", f"'{network}' is not allowed; allowed: "
                         f"{', '.join(NODE_NETWORKS)}"))
    if problems:
        raise SpecError(problems)
    assert gtype is not None
    return gtype


def start_local_ray(store: Store, name: str, nodes: int, gtype: GpuType, gpus_per_node: int,
                    fabric: str | None, network: str, make_default: bool,
                    on_node: Callable[[str, str], None] | None = None) -> LocalRay:
    """Start a Ray cluster here, one raylet per node on its own 127.x address, and add it as a
    managed pool; its settings. A cluster that fails to come up is stopped again."""
    from gpufleet.backends import ray_auth, ray_local
    from gpufleet.backends.local import free_port

    pools.check_name_field(name)
    pools.check_free_name(store, name)
    head_ip = f"{ray_local.subnet_for(name)}.1"
    cfg = ray_local.LocalRay(
        name=name, nodes=nodes, gpu=gtype.name, per_node=gpus_per_node,
        fabric=fabric or ("pcie" if gtype.is_cpu else gtype.node_fabric), network=network,
        head_ip=head_ip, port=free_port(head_ip),
        token_file=str(ray_auth.pool_token_path(gpufleet_home(), name)))
    ray_local.start(cfg, on_node=on_node)
    try:
        ray_local.wait_nodes(cfg)
        pools.add(store, name, "ray", cfg.address, json.loads(cfg.to_json()), make_default,
                  managed=True)
    except BaseException:
        ray_local.stop(cfg)
        raise
    return cfg


def stop_local_ray(store: Store, name: str) -> int:
    """Stop a Ray cluster `pool up --local` started and forget its pool; Ray processes ended."""
    from gpufleet.backends import ray_local

    pool = pools.get(store, name)
    if not pool.managed:
        raise ConflictError(f"pool: '{name}' was not started by gpufleet; forget it with "
                            f"gpufleet pool remove {name} (its Ray cluster is left running)")
    pools.remove(store, name)
    return ray_local.stop(ray_local.LocalRay.from_json(pool.spec_json))


def remove(store: Store, name: str) -> Pool:
    """Forget a pool; a Ray cluster gpufleet started for it is stopped too, others keep running."""
    pool = pools.remove(store, name)
    if pool.managed:
        from gpufleet.backends import ray_local

        ray_local.stop(ray_local.LocalRay.from_json(pool.spec_json))
    return pool

