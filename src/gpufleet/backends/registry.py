"""Open the backend of a stored pool: the one place that maps a pool kind to its engine.

Imports are inside `open_backend` so that asking for one engine does not import the others
(Ray's client, NVML): `gpufleet pool list` on a synthetic pool stays light.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.backends.base import Backend


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

        shapes = [sim.parse_shape(t) for t in json.loads(settings_json or "{}")["shapes"]]
        return sim.SimBackend(pool, shapes)
    if kind == "ray":
        from gpufleet.backends.ray import RayBackend

        if address is None:
            raise ValueError(f"pool {pool}: a Ray pool without an address")
        return RayBackend(pool, address, token_path)
    raise ValueError(f"pool {pool}: unknown backend kind {kind!r}")
