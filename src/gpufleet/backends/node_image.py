"""A node's launcher in the job's image, as a node agent starts it (SSH, Ray and Slurm pools).

The node plan carries the job's `Container` (launch/multinode.py); the agent on the node checks
the image there (backends/image_preflight.py: the runtime, the image per the pull policy, its
Python and torch, CUDA against this node's driver, /dev/shm) before anything starts, then wraps
the launcher in the runtime's command (launch/container.py). The agent stays on the host: its
keeper holds the runtime's client and removes the container by name once the client ended, so
a stop, a killed driver or a lost link leave no container behind. A failed check is an
`ImageError` whose line names the image and the node; the node's driver prints it and exits
`IMAGE_FAILED_EXIT`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.backends.image_preflight import Node, preflight
from gpufleet.launch.container import Container, NodeSide, package_dir, started_line, wrap

IMAGE_FAILED_EXIT = 78  # EX_CONFIG: the job's image cannot run on this node


@dataclass(frozen=True)
class InImage:
    """What the agent's keeper starts instead of the bare launcher."""

    argv: list[str]
    env: dict[str, str]
    after: list[str]  # removes the container once the runtime's client ended
    say: str  # the lines the node's output starts with


def in_image(container: Mapping[str, Any], run: str, node: str, argv: list[str],
             env: Mapping[str, str], cwd: str, seams: Node | None = None,
             sides: dict[str, NodeSide] | None = None) -> InImage:
    """The launcher `argv` inside the plan's image on this node (`node`: the pool's node id).
    `sides`: what an earlier run of this agent found (a restart does not probe again)."""
    c = Container.from_json(container)
    told: list[str] = []
    key = c.image
    side = sides.get(key) if sides is not None else None
    if side is None:
        # the probe runs as the job's container will: with the job's devices (none for a CPU
        # or simulated run), not whatever the node's own environment pins (a Slurm step's gres)
        side = preflight(c, node, told.append, seams or Node(environ={**os.environ, **env}))
        if sides is not None:
            sides[key] = side
    wrapped = wrap(c, side, argv, env, cwd, package_dir(), node, run, exists=os.path.isdir)
    told.append(started_line(c, side, wrapped, node))
    return InImage(wrapped.argv, wrapped.env, wrapped.cleanup,
                   "\n".join(f"gpufleet: {t}" for t in told))
