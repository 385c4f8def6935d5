"""Open the backend of a stored pool: the one place that maps a pool kind to its engine.

Imports are inside `open_backend` so that asking for one engine does not import the others
(Ray's client, NVML): `gpufleet pool list` on a synthetic pool stays light.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.backends.base import Backend

# A sim pool's backend holds nothing but its declared nodes, built on first discovery (2,000
# nodes: about 6 ms); one per (pool, shapes) serves every caller in a process, and hands them
# the same node list, which lifecycle/pool_index.py keeps its index against.
_SIMS: dict[tuple[str, str], Backend] = {}


def open_backend(kind: str, pool: str, address: str | None, settings_json: str | None,
                 token_path: Path | None, cpu_slots: int | None = None,
                 state_dir: Path | None = None) -> Backend:
    """The backend for a pool row's fields; `kind` "local" is this host (`cpu_slots` CPU worker
    slots, scratch space under `state_dir`)."""
    if kind == "local":
        from gpufleet.backends.local import LocalBackend

        return LocalBackend(cpu_slots, state_dir=state_dir)
    if kind == "sim":
        from gpufleet.backends import sim

        key = (pool, settings_json or "{}")
        if key not in _SIMS:  # the same nodes every time: a server keeps their index
            if len(_SIMS) >= 16:
                _SIMS.clear()
            shapes = [sim.parse_shape(t) for t in json.loads(settings_json or "{}")["shapes"]]
            _SIMS[key] = sim.SimBackend(pool, shapes)
        return _SIMS[key]
    if kind == "ray":
        from gpufleet.backends.ray import RayBackend

        if address is None:
            raise ValueError(f"pool {pool}: a Ray pool without an address")
        return RayBackend(pool, address, token_path)
    if kind == "slurm":
        from gpufleet.backends.slurm import SlurmBackend

        settings = json.loads(settings_json or "{}")
        return SlurmBackend(pool, settings.get("partition"), settings.get("account"),
                            settings.get("slurm_conf"))
    raise ValueError(f"pool {pool}: unknown backend kind {kind!r}")
