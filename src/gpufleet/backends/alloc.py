"""Allocation: the optional capability of an engine that grants the nodes itself.

Most engines hand gpufleet a set of nodes and let it reserve devices in its own store. An
engine that allocates (Slurm; a cloud or a Kubernetes queue later) is asked instead, queues the
request under its own policy, and grants an allocation that lives until it is given back. Such
an engine implements `Allocating` beside `Backend` and sets `allocates` in its row of
`kinds.CAPABILITIES` (so a spec or a stored cluster can ask before any engine object exists);
callers reach it with `isinstance(backend, Allocating)`, never by its name.

The types here are the engine's answers in gpufleet's words: what is asked (`Ask`), how an
allocation stands (`Pending` with the engine's own reason, `Granted` with its nodes, `Ended`),
what the engine's queue holds (`Queued`), and how a heal asks again (`heal_shapes`). The
waiting, the saying and the recording are `lifecycle.engine_alloc`'s, the same for every such
engine; this module is a leaf (no engine, no store).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from gpufleet.pool.model import Node


@dataclass(frozen=True)
class Ask:
    """What one cluster asks the engine for: `count` devices of catalog type `gpu` over
    `nodes` nodes, and `spares` nodes more like them in the same allocation, none of `exclude`
    (a heal's lost nodes). An allocation with spares must outlive the failure of one of its
    nodes (Slurm's `--no-kill`): that is when a spare is used."""

    cluster: str
    gpu: str
    count: int
    nodes: int
    time_limit_s: float | None = None
    exclude: tuple[str, ...] = ()
    user: str = ""  # whom it is for: engines that keep a note with the allocation show it
    network: str | None = None  # "infiniband" or "ethernet" between nodes; None: any
    spares: int = 0  # whole nodes more, held in the same allocation (`--spares`), not in `count`

    @property
    def per_node(self) -> int:
        return self.count // self.nodes


@dataclass(frozen=True)
class Pending:
    """Queued by the engine. `reason` is the engine's own word ("" when it gives none),
    `text` the same with what it means; `never_clears`: no wait can satisfy it."""

    reason: str
    text: str
    never_clears: bool = False


@dataclass(frozen=True)
class Granted:
    """Running: each granted node with the device indices it grants, in allocation order
    (no indices: all of the node's devices)."""

    grants: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Ended:
    """Over without (or after) running; `state` in the engine's own words."""

    state: str


AllocState = Pending | Granted | Ended


@dataclass(frozen=True)
class Queued:
    """One allocation gpufleet asked for, as the engine's queue shows it (`gpufleet jobs`)."""

    ref: str
    state: str  # the engine's own word: PENDING, RUNNING
    reason: str  # readable pending reason ("" once running)
    nodes: str  # the engine's own list of nodes ("" while pending)
    pending: bool


@runtime_checkable
class Allocating(Protocol):
    """An engine that grants nodes. Every call talks to the engine and may block for that
    one exchange (at most about 30 s, then a `ConflictError` saying it did not answer); none
    waits for the engine's queue: `lifecycle.engine_alloc` polls `state` while it is
    `Pending` and decides how long to wait."""

    engine_name: str  # how users know the engine: "Slurm"
    alloc_word: str  # the engine's own name for one allocation: "Slurm job"

    @property
    def kind(self) -> str:
        """The engine's kind as pools store it ("slurm"): how its messages start."""
        ...

    @property
    def where(self) -> str:
        """The part of the engine the pool allocates from, for messages: "partition gpu"."""
        ...

    def discover(self) -> list[Node]: ...

    def request(self, ask: Ask) -> tuple[str, str]:
        """Submit the request; returns at once with the allocation's id and how the engine
        reads the shape ("2 node(s) x --gres=gpu:h100:8"). What the engine refuses outright
        is an `AllocationError` with its own reason; nothing is left submitted then."""
        ...

    def state(self, ref: str) -> AllocState:
        """How the allocation stands now (one query; `Ended` once the engine forgot it)."""
        ...

    def cancel(self, ref: str) -> None:
        """Give the allocation back; one the engine already ended or forgot is fine."""
        ...

    def queued(self) -> list[Queued]:
        """gpufleet's allocations in the engine's queue (one query, about 10 s at most)."""
        ...

    def dry_run(self, ask: Ask | None, ref: str, node_ids: list[str], job_dir: Path) -> list[str]:
        """The command lines a run would use: a new allocation's request (`ask`), then what
        starts each node's workers inside allocation `ref`. Pure: nothing is run."""
        ...

    def shell(self, ref: str, node_id: str, argv: list[str],
              env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The command and environment that run `argv` on `node_id` inside `ref`."""
        ...


def heal_shapes(nodes: int, lost: int) -> list[int]:
    """Node counts a heal asks for, in order, after `lost` of a cluster's `nodes` were lost:
    the same size on other nodes first (a replacement at once), then the nodes left."""
    keep = nodes - lost
    return [nodes] + ([keep] if 0 < keep < nodes else [])
