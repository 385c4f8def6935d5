"""Reaching a cluster's node: which node a name means, and the command line that gives a shell
or runs a command there with the node's devices and environment.

On this machine (the local pool, a local Ray pool) that is the command itself with the node's
settings; on another machine of a Ray pool, `ssh` to its address with the same settings; on a
Slurm pool, `srun --pty` into the node, as a step of the cluster's own allocation; on an engine
with a way of its own (`backends.base.NodeShell`: an SSH pool's pinned keys, user and key),
that.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from gpufleet.backends.kinds import capabilities
from gpufleet.errors import ConflictError, NotFoundError
from gpufleet.lifecycle import clusters
from gpufleet.store import Cluster, Store


@dataclass(frozen=True)
class Invocation:
    """A command ready for `subprocess.call`."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


def target(store: Store, name: str) -> tuple[Cluster, int]:
    """`big` is the head node of cluster big, `big-worker2` its third node."""
    try:
        return clusters.get(store, name), 0
    except NotFoundError:
        m = re.fullmatch(r"(.+)-worker(\d+)", name)
        if m is None:
            raise
    cluster = clusters.get(store, m.group(1))
    k = int(m.group(2))
    if not 1 <= k < cluster.nodes:
        last = f"{cluster.name}-worker{cluster.nodes - 1}" if cluster.nodes > 1 else "none"
        raise NotFoundError(f"node: cluster {cluster.name} has {cluster.nodes} node(s): "
                            f"{cluster.name} (head), workers up to {last}")
    return cluster, k


def node_preset(store: Store, cluster: Cluster, node: int) -> tuple[dict[str, str], str]:
    """What a job on the cluster's `node`-th node would get (devices pinned, presets), and the
    node's address."""
    from gpufleet.launch.env import device_env
    from gpufleet.launch.multinode import node_names

    placements = clusters.placements(store, cluster)
    p = placements[node]
    preset = device_env(p, cluster.network, os.cpu_count() or 1)
    return {**preset, "GPUFLEET_CLUSTER": cluster.name,
            "GPUFLEET_NODE": node_names(len(placements))[node]}, p.address


def is_here(address: str) -> bool:
    """Whether `address` is this machine (loopback, or one of its interfaces)."""
    import psutil

    from gpufleet.backends.ray import is_loopback

    if is_loopback(address):
        return True
    return any(a.address == address for addrs in psutil.net_if_addrs().values() for a in addrs)


def invocation(store: Store, name: str, command: list[str], cwd: Path | None) -> Invocation:
    """`command` (none: the user's shell) on the node `name` means, in `cwd` (none: the
    cluster's scratch folder)."""
    from gpufleet.launch.torchrun import merge_env

    cluster, node = target(store, name)
    if cluster.status not in clusters.ACTIVE:
        raise ConflictError(f"cluster: '{cluster.name}' is {cluster.status}; launch it again to "
                            "use it")
    if not capabilities(cluster.backend).ssh:
        raise ConflictError(f"cluster: '{cluster.name}' is on a simulated pool; it has no "
                            "machine to reach")
    preset, address = node_preset(store, cluster, node)
    argv = command or [os.environ.get("SHELL") or "/bin/bash"]
    env = merge_env(dict(os.environ), preset, {})
    if capabilities(cluster.backend).allocates:  # a step inside the cluster's allocation
        from gpufleet.lifecycle import engine_alloc

        engine = engine_alloc.allocator(store, cluster.pool)
        if engine is not None:
            node_id = clusters.placements(store, cluster)[node].node_id
            argv, env = engine.shell(cluster.engine_ref or "", node_id, argv, env)
            return Invocation(argv, env, cwd or Path(cluster.scratch_dir))
    from gpufleet.backends.base import NodeShell
    from gpufleet.lifecycle import pools

    pool = pools.pool_of(store, cluster)
    engine_here = pools.backend_for(pool) if pool is not None else None
    if isinstance(engine_here, NodeShell):  # the engine's own way in (an SSH pool's options)
        node_id = clusters.placements(store, cluster)[node].node_id
        argv, env = engine_here.shell(cluster.engine_ref or "", node_id, argv, preset)
        return Invocation(argv, env, cwd or Path(cluster.scratch_dir))
    if not is_here(address):  # another machine of a Ray pool: over ssh, with the same settings
        remote = ["env", *(f"{k}={v}" for k, v in sorted(preset.items())), *argv]
        argv, env = ["ssh", "-t", address, shlex.join(remote)], dict(os.environ)
    return Invocation(argv, env, cwd or Path(cluster.scratch_dir))
