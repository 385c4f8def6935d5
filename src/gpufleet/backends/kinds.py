"""The engine kinds and what each can do: a leaf module, so the spec (which validates a pool's
kind) and the allocator can ask without importing any engine or the backend protocol.

Code outside `backends/` never asks which engine a pool is: it asks `capabilities(kind)` (for
a spec or a stored cluster, before any backend object exists) or `backend.capabilities`. A new
engine (Slurm, Kubernetes) is a row in `CAPABILITIES` (and its entry in `registry.ENGINES`),
not a branch in the supervisor, the CLI and the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from gpufleet.errors import excerpt


def check_kind(kind: str) -> str:
    """`kind` when an engine of that kind is known (built in, or registered at run time)."""
    if kind not in CAPABILITIES:
        names = [f"'{k}'" for k in CAPABILITIES]
        allowed = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
        raise ValueError(f"'{excerpt(kind)}' is not allowed; allowed: {allowed}")
    return kind


class _Known:
    """Makes a spec's `backend: Kind` check the kind against `CAPABILITIES` when pydantic
    validates it (pydantic is imported only then: this module stays a light leaf)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(check_kind, handler(source))


# A kind is a name in `CAPABILITIES`, not a closed list: a new engine adds its row (a test's
# toy engine at run time) and specs, stored clusters and pools accept it with no other change.
Kind = Annotated[str, _Known()]
KINDS: tuple[str, ...] = ("local", "ray", "sim", "slurm", "ssh")  # the built-in engines


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, so callers decide by capability rather than by name."""

    this_host: bool  # its one node is the machine gpufleet runs on (disk checked, bench here)
    multi_node: bool  # a cluster may span nodes; a job runs one process group per node
    elastic: bool  # a job may change size while it runs (--workers MIN:MAX)
    ssh: bool  # `gpufleet ssh` reaches a shell on its nodes
    simulated: bool  # declared devices: plan and reserve only, no processes run
    samples_devices: bool  # the supervisor samples devices itself (else node agents report)
    # the engine grants the nodes (one allocation per cluster, waited for while it queues);
    # gpufleet's own reservations then record what it granted, and it is released on stop
    allocates: bool = False

    @property
    def runs_jobs(self) -> bool:
        return not self.simulated


# a dict, not a frozen mapping: an engine registered at run time (a test's toy engine) adds its row
CAPABILITIES: dict[str, Capabilities] = {
    "local": Capabilities(this_host=True, multi_node=False, elastic=True, ssh=True,
                          simulated=False, samples_devices=True),
    "ray": Capabilities(this_host=False, multi_node=True, elastic=False, ssh=True,
                        simulated=False, samples_devices=False),
    "sim": Capabilities(this_host=False, multi_node=True, elastic=False, ssh=False,
                        simulated=True, samples_devices=False),
    "slurm": Capabilities(this_host=False, multi_node=True, elastic=False, ssh=True,
                          simulated=False, samples_devices=False, allocates=True),
    # a team's own machines over ssh: gpufleet's allocator gangs whole nodes, as on Ray
    "ssh": Capabilities(this_host=False, multi_node=True, elastic=False, ssh=True,
                        simulated=False, samples_devices=False),
}


def capabilities(kind: str | None) -> Capabilities:
    """The capabilities of a pool kind as stored on a cluster or spec (None: this host)."""
    for known, caps in CAPABILITIES.items():
        if known == (kind or "local"):
            return caps
    raise ValueError(f"unknown backend kind {kind!r}; known: {', '.join(CAPABILITIES)}")
