"""A job's container: what the job asks (`Container`) and what only its node knows (`NodeSide`).

PLACEHOLDER on the runtime branch: only the two types of the lead's design (notes/30/design.md),
so the node's preflight (`backends/image_preflight.py`) can return a `NodeSide`. The lead's
module (with `wrap`, `opt_problems`, `name_of`, `leftovers_argv`) replaces this file whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpufleet.vocab import Pull

Flavor = Literal["podman", "docker"]


@dataclass(frozen=True)
class Container:
    """The job's ask; the same on every node."""

    image: str
    pull: Pull = "missing"
    opts: tuple[str, ...] = ()
    shm_size: str | None = None  # e.g. "8g": private IPC with that size; None: --ipc host
    job: str = ""  # the label value and the name's prefix


@dataclass(frozen=True)
class NodeSide:
    """What only the node knows, found there before any worker starts."""

    runtime: str  # path or name of podman/docker
    flavor: Flavor
    python: str = "python3"  # the image's interpreter
    memlock: int = -1  # -1 unlimited, else bytes
    uid_gid: tuple[int, int] | None = None  # docker runs as the caller when not root
