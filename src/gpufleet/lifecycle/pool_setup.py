"""Adding pools: checking what the user asked for, reaching an existing Ray cluster, starting a
local one, and stopping the one gpufleet started when its pool goes.

`lifecycle.pools` keeps the records; this module does what `pool add`, `pool up`, `pool down`
and `pool remove` do around them, so a caller other than the CLI gets the same refusals.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet import catalog
from gpufleet.catalog import GpuType
from gpufleet.errors import ConflictError, SpecError
from gpufleet.lifecycle import pools
from gpufleet.pool.model import FABRIC_LEVEL, Node
from gpufleet.store import Pool, Store, gpufleet_home
from gpufleet.vocab import INTER_NODE_NETWORKS

if TYPE_CHECKING:
    from gpufleet.backends.ray_local import LocalRay

ADDABLE = ("ray", "slurm", "sim")  # `pool add KIND`; this host is the built-in pool 'local'
NODE_NETWORKS = INTER_NODE_NETWORKS


@dataclass(frozen=True)
class Added:
    """A pool just registered, and what it holds."""

    name: str
    nodes: int  # live nodes
    devices: int
    summary: str  # what `pool add` says of it, e.g. "simulated, 1000 nodes, 8000 devices"


def add_ray(store: Store, name: str | None, address: str | None, shapes: list[str],
            token_file: Path | None, make_default: bool) -> Added:
    """Register an existing Ray cluster once it is reachable with its token; the token is copied
    beside the pool, and forgotten again if the cluster cannot be added."""
    from gpufleet.backends import ray_auth
    from gpufleet.backends.ray import RayBackend

    pool_name = pools.check_name_field(name or "ray")
    if address is None or shapes:
        raise SpecError([("address", "a Ray pool needs --address HOST:PORT (and no --shape)")])
    pools.check_address(address)
    pools.check_free_name(store, pool_name)
    given = ray_auth.given_token(token_file, os.environ, Path.home())
    path = None if given is None else ray_auth.save_token(
        ray_auth.pool_token_path(gpufleet_home(), pool_name), given.token)
    try:  # reachable, the token accepted, and what it has
        found: list[Node] = RayBackend(pool_name, address, path,
                                       token_source=given.source if given else None,
                                       adding=True).discover()
        pools.add(store, pool_name, "ray", address, {"token_file": str(path)} if path else {},
                  make_default)
    except BaseException:
        if path is not None:
            ray_auth.forget(path)
        raise
    live = [n for n in found if n.healthy]
    devices = sum(len(n.devices) for n in live)
    return Added(pool_name, len(live), devices,
                 f"Ray cluster at {address}, {len(live)} live node(s), {devices} device(s)")


def add_sim(store: Store, name: str | None, address: str | None, shapes: list[str],
            token_file: Path | None, make_default: bool) -> Added:
    """Register a synthetic pool of declared devices (`--shape NODESxGPU:PER_NODE`)."""
    from gpufleet.backends import sim

    pool_name = pools.check_name_field(name or "sim")
    if address is not None or token_file is not None:
        field = "address" if address is not None else "token_file"
        raise SpecError([(field, f"a sim pool has no {field.replace('_', ' ')}; give --shape")])
    parsed = sim.parse_shapes(shapes)
    pools.add(store, pool_name, "sim", None, {"shapes": [x.text() for x in parsed]}, make_default)
    nodes, devices = sum(x.nodes for x in parsed), sum(x.nodes * x.per_node for x in parsed)
    return Added(pool_name, nodes, devices, f"simulated, {nodes} nodes, {devices} devices")


def add_slurm(store: Store, name: str | None, partition: str | None, account: str | None,
              make_default: bool) -> Added:
    """Register a Slurm partition reachable with this machine's Slurm client commands (and its
    $SLURM_CONF, kept with the pool); no --partition: the cluster's default partition."""
    from gpufleet.backends.slurm import SlurmBackend

    pool_name = pools.check_name_field(name or "slurm")
    pools.check_free_name(store, pool_name)
    conf = os.environ.get("SLURM_CONF") or None
    probe = SlurmBackend(pool_name, None, account, conf)
    known = probe.partitions()
    if partition is None:
        partition = probe.default_partition()
        if partition is None:
            raise SpecError([("partition", "the Slurm cluster has no default partition; give "
                              f"--partition, one of: {', '.join(known) or 'none'}")])
    elif partition not in known:
        raise SpecError([("partition", f"'{partition}' is not a partition of this Slurm "
                          f"cluster; allowed: {', '.join(known) or 'none'}")])
    found = SlurmBackend(pool_name, partition, account, conf).discover()
    settings = {"partition": partition, "account": account, "slurm_conf": conf}
    pools.add(store, pool_name, "slurm", None, {k: v for k, v in settings.items() if v},
              make_default)
    live = [n for n in found if n.healthy]
    devices = sum(len(n.devices) for n in found)
    types = ", ".join(sorted({d.gpu for n in found for d in n.devices})) or "no GPUs"
    return Added(pool_name, len(live), devices,
                 f"Slurm partition {partition}, {len(found)} node(s) ({len(live)} up), "
                 f"{devices} GPU(s): {types}")


def add(store: Store, kind: str, name: str | None, address: str | None, shapes: list[str],
        token_file: Path | None, make_default: bool, partition: str | None = None,
        account: str | None = None) -> Added:
    """`pool add KIND ...`: the kind's own checks and registration."""
    kind = check_kind(kind)
    given = [f for f, v in (("partition", partition), ("account", account)) if v is not None]
    if kind == "slurm":
        wrong = [f for f, v in (("address", address), ("token_file", token_file),
                                ("shape", shapes or None)) if v is not None]
        if wrong:
            raise SpecError([(wrong[0], "a Slurm pool takes --partition and --account only")])
        return add_slurm(store, name, partition, account, make_default)
    if given:
        raise SpecError([(given[0], f"--{given[0]} is for a Slurm pool, not a {kind} pool")])
    adder = {"ray": add_ray, "sim": add_sim}[kind]
    return adder(store, name, address, shapes, token_file, make_default)


def check_kind(kind: str) -> str:
    """The kind `pool add` was given, refused before the store is opened."""
    if kind not in ADDABLE:
        raise SpecError([("kind", f"'{kind}' is not allowed; allowed: {', '.join(ADDABLE)} (this "
                          "host is the built-in pool 'local')")])
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

