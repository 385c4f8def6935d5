"""The engines by kind: the one place that maps a pool kind to its engine.

Each kind has an `Engine` row: how to open its backend from a stored pool's fields, how its
pools are described in `pool list`, and (for the kinds `pool add` takes) how one is checked
and probed before it is stored. Code outside `backends/` asks this table (or
`kinds.capabilities`) and never compares a kind. A new engine is a module here, a row in
`ENGINES` and one in `kinds.CAPABILITIES`.

The engines' modules are imported inside the rows, so that asking for one engine does not
import the others (Ray's client, NVML): `gpufleet pool list` on a synthetic pool stays light.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.backends.base import Backend

if TYPE_CHECKING:
    from gpufleet.backends.adders import AddRequest, Registration


@dataclass(frozen=True)
class Opening:
    """A stored pool's fields, as an engine needs them to open its backend."""

    pool: str
    address: str | None
    settings: dict[str, Any]  # the pool's stored settings (its spec_json)
    cpu_slots: int | None = None  # this host only: CPU worker slots
    state_dir: Path | None = None  # this host only: scratch space


@dataclass(frozen=True)
class Engine:
    """One engine kind's entry: `open` its backend, say `where` a pool of it is (the `pool
    list` title: an address, a partition), and, for a kind `pool add` takes, `add` one."""

    open: Callable[[Opening], Backend]
    where: Callable[[str | None, dict[str, Any]], str]
    add: Callable[[AddRequest], Registration] | None = None


# A sim pool's backend holds nothing but its declared nodes, built on first discovery (2,000
# nodes: about 6 ms); one per (pool, shapes) serves every caller in a process, and hands them
# the same node list, which lifecycle/pool_index.py keeps its index against.
_SIMS: dict[tuple[str, str], Backend] = {}


def _local(o: Opening) -> Backend:
    from gpufleet.backends.local import LocalBackend

    return LocalBackend(o.cpu_slots, state_dir=o.state_dir)


def _sim(o: Opening) -> Backend:
    from gpufleet.backends import sim

    key = (o.pool, json.dumps(o.settings, sort_keys=True))
    if key not in _SIMS:  # the same nodes every time: a server keeps their index
        if len(_SIMS) >= 16:
            _SIMS.clear()
        _SIMS[key] = sim.SimBackend(o.pool, [sim.parse_shape(t) for t in o.settings["shapes"]])
    return _SIMS[key]


def _ray(o: Opening) -> Backend:
    from gpufleet.backends.ray import RayBackend

    if o.address is None:
        raise ValueError(f"pool {o.pool}: a Ray pool without an address")
    token = o.settings.get("token_file")  # the pool's copy of its cluster's token
    return RayBackend(o.pool, o.address, Path(token) if token else None)


def _slurm(o: Opening) -> Backend:
    from gpufleet.backends.slurm import SlurmBackend

    s = o.settings
    return SlurmBackend(o.pool, s.get("partition"), s.get("account"), s.get("slurm_conf"))


def _ssh(o: Opening) -> Backend:
    from gpufleet.backends.ssh import SshBackend
    from gpufleet.backends.ssh_conn import Host

    s = o.settings
    return SshBackend(o.pool, [Host.from_json(h) for h in s.get("hosts", [])],
                      Path(s["known_hosts"]))


def _ssh_where(_address: str | None, s: dict[str, Any]) -> str:
    n = len(s.get("hosts", []))
    return f"{n} host{'' if n == 1 else 's'} over ssh"


def _add_ssh(r: AddRequest) -> Registration:
    from gpufleet.backends import adders

    return adders.add_ssh(r)


def _add_ray(r: AddRequest) -> Registration:
    from gpufleet.backends import adders

    return adders.add_ray(r)


def _add_slurm(r: AddRequest) -> Registration:
    from gpufleet.backends import adders

    return adders.add_slurm(r)


def _add_sim(r: AddRequest) -> Registration:
    from gpufleet.backends import adders

    return adders.add_sim(r)


# `pool add KIND` takes the kinds with an `add`, in this order; this host is built in
ENGINES: dict[str, Engine] = {
    "ray": Engine(_ray, lambda address, _s: str(address or "simulated"), _add_ray),
    "slurm": Engine(_slurm, lambda _a, s: f"partition {s.get('partition', '(default)')}",
                    _add_slurm),
    "ssh": Engine(_ssh, _ssh_where, _add_ssh),
    "sim": Engine(_sim, lambda _a, _s: "simulated", _add_sim),
    "local": Engine(_local, lambda _a, _s: "this host"),
}


def engine(kind: str, pool: str = "") -> Engine:
    found = ENGINES.get(kind)
    if found is None:
        raise ValueError(f"pool {pool}: unknown backend kind {kind!r}")
    return found


def addable() -> tuple[str, ...]:
    """The kinds `pool add` takes."""
    return tuple(kind for kind, e in ENGINES.items() if e.add is not None)


def open_backend(kind: str, pool: str, address: str | None, settings_json: str | None,
                 cpu_slots: int | None = None, state_dir: Path | None = None) -> Backend:
    """The backend for a pool row's fields; `kind` "local" is this host (`cpu_slots` CPU worker
    slots, scratch space under `state_dir`)."""
    return engine(kind, pool).open(Opening(pool, address, json.loads(settings_json or "{}"),
                                           cpu_slots, state_dir))


def where(kind: str, address: str | None, settings_json: str | None) -> str:
    """Where a pool of `kind` is, as `pool list` titles it."""
    return engine(kind).where(address, json.loads(settings_json or "{}"))
