"""A cluster as every reader shows it: one row, made here and nowhere else.

`gpufleet list` (read through the store, or straight from the state file by `snapshot`),
`list --json`, `launch --json` and the server's /api/v1/clusters all return `row(...)`, so a
command gives the same keys here and through a server (issue 27: the server's rows lacked
`topology` and `health`, and `list` crashed on them). The dashboard's and `status`'s shorter
`summary` is the first part of the same row.

Pure and stdlib-only (plus `plan.cost` once a row is made): the caller reads the cluster, its
devices, its newest job and its health, and passes `now`; `snapshot` uses it without
SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpufleet.slot_words import network_shown

SUMMARY_KEYS = ("name", "gpu", "count", "nodes", "network", "devices", "status", "price_book",
                "usd_per_hour", "started_at", "stopped_at", "cost_usd", "job", "job_status")
KEYS = (*SUMMARY_KEYS, "topology", "health", "placements", "spares", "pool", "simulated",
        "user", "for_job", "created_at", "age_s")


class Summarized(Protocol):
    """The fields of a cluster (store.Cluster, or a row read with sqlite3) a summary reads."""

    @property
    def name(self) -> str: ...
    @property
    def gpu(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def network(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def price_book(self) -> str | None: ...
    @property
    def usd_per_hour(self) -> float: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def stopped_at(self) -> float | None: ...
    @property
    def banked_usd(self) -> float | None: ...
    @property
    def rate_since(self) -> float | None: ...


class Rowed(Summarized, Protocol):
    """The further fields a full row reads."""

    @property
    def created_at(self) -> float: ...
    @property
    def pool(self) -> str | None: ...
    @property
    def simulated(self) -> bool | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def for_job(self) -> str | None: ...


@dataclass(frozen=True)
class Stored:
    """A `clusters` row as `snapshot` reads it with sqlite3: exactly what `Rowed` names."""

    name: str
    gpu: str
    count: int
    nodes: int
    network: str
    status: str
    price_book: str | None
    usd_per_hour: float
    started_at: float | None
    stopped_at: float | None
    banked_usd: float | None
    rate_since: float | None
    created_at: float
    pool: str | None
    simulated: bool | None
    user: str | None
    for_job: str | None


COLUMNS = tuple(Stored.__dataclass_fields__)  # the `clusters` columns a row is made of

Placed = Mapping[str, Sequence[str]]  # node id -> the ids of the devices reserved on it


def device_ids(placed: Placed) -> list[str]:
    """The devices as one list: plain ids on one node, node/device on several."""
    if len(placed) == 1:
        return list(next(iter(placed.values())))
    return [f"{node}/{d}" for node, ids in placed.items() for d in ids]


def summary(c: Summarized, placed: Placed, newest_job: tuple[str, str] | None,
            now: float) -> dict[str, Any]:
    """What the dashboard and a job's `cluster_info` show: the cluster, its devices, its cost
    so far (USD, frozen at its stop) and its newest job's (name, status)."""
    from gpufleet.plan import cost  # here: `stop --all` reads COLUMNS without the catalog

    return {
        "name": c.name, "gpu": c.gpu, "count": c.count, "nodes": c.nodes, "network": c.network,
        "devices": device_ids(placed), "status": c.status, "price_book": c.price_book,
        "usd_per_hour": c.usd_per_hour, "started_at": c.started_at, "stopped_at": c.stopped_at,
        "cost_usd": cost.accrued_usd(c.usd_per_hour, c.started_at, c.stopped_at, now,
                                     c.banked_usd or 0.0, c.rate_since),
        "job": newest_job[0] if newest_job else None,
        "job_status": newest_job[1] if newest_job else None,
    }


def row(c: Rowed, placed: Placed, newest_job: tuple[str, str] | None, health: str,
        now: float, spares: Sequence[str] = ()) -> dict[str, Any]:
    """`list`'s row: the summary, plus the topology, `health` (what the caller found of the
    devices now: "ok", "degraded: ...", "-" for a stopped cluster), the devices by node, the
    spare nodes it holds beside them (`--spares`: billed in `usd_per_hour`), the pool, who
    owns it, and its age in seconds."""
    return {
        **summary(c, placed, newest_job, now),
        "topology": network_shown(c.gpu, c.network), "health": health,
        "placements": {node: list(ids) for node, ids in placed.items()},
        "spares": list(spares),
        "pool": c.pool or "local", "simulated": bool(c.simulated), "user": c.user,
        "for_job": c.for_job, "created_at": c.created_at, "age_s": now - c.created_at,
    }
