"""`status JOB` of an ended job read straight from the state file with stdlib `sqlite3`.

Opening the store costs SQLAlchemy (half a second of CPU) and validating the stored spec costs
Pydantic (almost as much), while an ended job needs neither: `reconcile.refresh` only reconciles an
active job, and nothing writes under a job that has ended. `job_detail` builds the same dict as
`views.job_detail` through the same pure `supervise.view.job_view`, from plain rows; it returns
None, and the caller opens the store as before, for: no state file, another schema version, an
unknown job or cluster, an active job, an active job on the same cluster (the store's
`reconcile` may stop that cluster first), a stored spec the layout cannot be told from without
Pydantic (see `layout_words`), or any sqlite3 error. `store/models.py` stays the one schema:
`COLUMNS` names what is read here, and tests/unit/test_snapshot_job.py checks it against the
models and this dict against `views.job_detail` on a real store.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet import cluster_row, durable_copy
from gpufleet.parallelism import LayoutError, resolve
from gpufleet.snapshot import SCHEMA_VERSION, Declined, read_only
from gpufleet.status import JOB_ACTIVE
from gpufleet.supervise import timeline
from gpufleet.supervise.view import job_view
from gpufleet.telemetry.schema import JOB_RANK, MODEL_STATE_METRICS, STEP_METRIC

ACTIVE = tuple(str(s) for s in JOB_ACTIVE)
LATEST_WINDOW_S = 30.0  # telemetry.records.latest's default window
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}  # as telemetry.records.findings sorts

# JobSpec's fields as stored by `model_dump_json`; a spec with other keys goes through Pydantic.
SPEC_FIELDS = frozenset({
    "script", "args", "name", "cluster", "workers_per_node", "strategy", "dp", "tp", "pp",
    "pp_schedule", "microbatches", "precision", "framework", "model", "env", "max_restarts",
    "hang_timeout", "cooldown", "checkpoint_to", "workers", "scale_up_util", "scale_down_util",
    "scale_tolerance", "keep", "workdir", "bootstrap", "total_steps", "loss_pattern", "priority",
    "time_limit", "after", "setup", "max_upload", "keep_workdir", "image", "pull",
    "container_opts", "shm_size", "warm", "preload"})
# the same, as earlier versions stored them (their jobs' specs stay readable here): before
# warm workers (issue 31), before images (issue 30), before the workdir travelled (issue 29),
# and before `after`
SPEC_FIELDS_BEFORE_WARM = SPEC_FIELDS - {"warm", "preload"}
SPEC_FIELDS_BEFORE_IMAGE = SPEC_FIELDS_BEFORE_WARM - {"image", "pull", "container_opts",
                                                      "shm_size"}
SPEC_FIELDS_BEFORE_WORKDIR = SPEC_FIELDS_BEFORE_IMAGE - {"setup", "max_upload", "keep_workdir"}
SPEC_FIELDS_BEFORE_AFTER = SPEC_FIELDS_BEFORE_WORKDIR - {"after"}
SPEC_WORDS = ("strategy", "pp_schedule", "precision", "framework")  # Literal[str] fields
SPEC_INT_BOUNDS = {"dp": (1, 128), "tp": (1, 128), "pp": (1, 128), "microbatches": (1, 4096)}


@dataclass(frozen=True)
class JobRow:
    """A `jobs` row: what `job_view` reads (supervise.view.JobRecord), plus its keys."""

    id: int
    cluster_id: int
    name: str
    status: str
    spec_json: str
    world_size: int
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    step: int | None
    total_steps: int | None
    samples: int
    loss: float | None
    first_loss: float | None
    samples_per_s: float | None
    first_step: int | None
    first_step_at: float | None
    last_report_at: float | None
    reason: str | None
    layout_seen: str | None
    billed_micro_usd: int | None
    run_from_micro_usd: int | None


@dataclass(frozen=True)
class ClusterRow:
    """A `clusters` row: what `job_view` and `views.cluster_dict` read."""

    id: int
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
    simulated: bool | None


COLUMNS: dict[str, tuple[str, ...]] = {
    "jobs": tuple(JobRow.__dataclass_fields__),
    "clusters": tuple(ClusterRow.__dataclass_fields__),
    "job_events": ("id", "job_id", "time", "kind", "reason"),
    "findings": ("id", "job_id", "key", "rule", "severity", "subject", "title", "detail", "fix",
                 "first_seen", "last_seen", "active"),
    "metrics": ("job", "name", "rank", "device", "time", "value"),
    "reservations": ("cluster_id", "node_id", "device_id", "device_index"),
}


def layout_words(spec_json: str, world_size: int) -> str | None:
    """`supervise.view.requested_layout` without Pydantic, for a spec stored as this version's
    `JobSpec.model_dump_json` writes it: exactly its keys, a cluster named (a cluster spec would
    need the catalog's checks), and the layout fields of their exact types within the model's
    bounds. For such a spec the validated fields equal the stored ones, so `resolve` on them
    gives the same words (or the same None, for a layout that cannot be). Anything else
    raises Declined. Not re-checked: the other fields' own validators (env names, durations),
    which every spec passed when it was stored."""
    try:
        data = json.loads(spec_json)
    except ValueError:
        raise Declined from None
    if not isinstance(data, dict) or set(data) not in (SPEC_FIELDS, SPEC_FIELDS_BEFORE_WARM,
                                                      SPEC_FIELDS_BEFORE_IMAGE,
                                                      SPEC_FIELDS_BEFORE_WORKDIR,
                                                      SPEC_FIELDS_BEFORE_AFTER) \
            or not (data["cluster"] is None or isinstance(data["cluster"], str)) \
            or any(not isinstance(data[k], str) for k in SPEC_WORDS):
        raise Declined
    for key, (low, high) in SPEC_INT_BOUNDS.items():
        v = data[key]
        if v is not None and (type(v) is not int or not low <= v <= high):
            raise Declined
    try:
        layout = resolve(data["strategy"], world_size, dp=data["dp"], tp=data["tp"],
                         pp=data["pp"], precision=data["precision"],
                         schedule=data["pp_schedule"], microbatches=data["microbatches"],
                         framework=data["framework"])
    except LayoutError:
        return None
    return f"{layout.describe}, {data['framework']}"


def job_detail(path: Path, name: str, now: float) -> dict[str, Any] | None:
    """`views.job_detail(store, name, now)` for an ended job, or None when the store must
    answer (see the module's docstring)."""
    return read_only(path, lambda db: _detail(db, name, now))


def _select(db: sqlite3.Connection, table: str, where: str, args: list[Any]) -> list[dict[str, Any]]:
    cols = COLUMNS[table]
    rows = db.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE {where}", args)
    return [dict(zip(cols, r, strict=True)) for r in rows]


def _detail(db: sqlite3.Connection, name: str, now: float) -> dict[str, Any]:
    if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
        raise Declined
    db.execute("BEGIN")  # one snapshot for every query below
    found = _select(db, "jobs", "name = ?", [name])
    if not found or found[0]["status"] in ACTIVE:
        raise Declined
    job = JobRow(**found[0])
    clusters = _select(db, "clusters", "id = ?", [job.cluster_id])
    if not clusters:
        raise Declined
    c = ClusterRow(**clusters[0])
    marks = ",".join("?" * len(ACTIVE))
    if db.execute(f"SELECT count(*) FROM jobs WHERE cluster_id = ? AND status IN ({marks})",
                  [c.id, *ACTIVE]).fetchone()[0]:
        raise Declined
    words = layout_words(job.spec_json, job.world_size)
    view = job_view(job, c, now, _model_state(db, job.name), lambda _spec, _n: words)
    events = [{"time": e["time"], "kind": e["kind"], "reason": e["reason"]}
              for e in _select(db, "job_events", "job_id = ? ORDER BY time, id", [job.id])]
    return {
        **view.as_dict(),
        "now": now,
        "cluster_info": _cluster_info(db, c, now),
        "events": events,
        "durable_copy": durable_copy.of_rows(events),
        "findings": _findings(db, job.id),
        "latest": _latest(db, job.name),
        "nodes": _nodes(db, job.name),
        **timeline.of_rows(events, lambda t: _rank0_step_at(db, job.name, t)),
    }


def _cluster_info(db: sqlite3.Connection, c: ClusterRow, now: float) -> dict[str, Any]:
    """`views.cluster_dict`: the cluster, its devices and its newest job."""
    job = db.execute("SELECT name, status FROM jobs WHERE cluster_id = ? ORDER BY id DESC "
                     "LIMIT 1", [c.id]).fetchone()
    placed: dict[str, list[str]] = {}
    for r in _select(db, "reservations", "cluster_id = ? ORDER BY node_id, device_index",
                     [c.id]):
        placed.setdefault(r["node_id"], []).append(r["device_id"])
    return cluster_row.summary(c, placed, (job[0], job[1]) if job else None, now)


def _findings(db: sqlite3.Connection, job_id: int) -> list[dict[str, Any]]:
    """`records.findings`: active ones first, most severe first, then oldest (the same query,
    so rows that tie keep the order the store reads them in)."""
    rows = _select(db, "findings", "job_id = ?", [job_id])
    rows.sort(key=lambda r: (not r["active"], SEVERITY_ORDER.get(r["severity"], 3),
                             r["first_seen"]))
    return [{"rule": r["rule"], "severity": r["severity"], "subject": r["subject"],
             "title": r["title"], "detail": r["detail"], "fix": r["fix"],
             "first_seen": r["first_seen"], "last_seen": r["last_seen"],
             "active": bool(r["active"])} for r in rows]


def _label(rank: int, device: str | None) -> str:
    """`records.label`: a device id, "job", or "rank N"."""
    if device is not None:
        return device
    return "job" if rank == JOB_RANK else f"rank {rank}"


def _latest(db: sqlite3.Connection, job: str) -> dict[str, dict[str, float]]:
    """`records.latest`: the newest value of every series within the window before the job's
    newest sample, label -> name -> value."""
    newest = db.execute("SELECT time FROM metrics WHERE job = ? ORDER BY time DESC LIMIT 1",
                        [job]).fetchone()
    if newest is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for name, rank, device, value in db.execute(
            "SELECT name, rank, device, value FROM metrics WHERE job = ? AND time >= ? "
            "ORDER BY time", [job, newest[0] - LATEST_WINDOW_S]):
        out.setdefault(_label(rank, device), {})[name] = value  # later rows win
    return out


def _nodes(db: sqlite3.Connection, job: str) -> dict[str, str]:
    """`records.nodes`: the node each series of `_latest` came from, over the same window."""
    newest = db.execute("SELECT time FROM metrics WHERE job = ? ORDER BY time DESC LIMIT 1",
                        [job]).fetchone()
    if newest is None:
        return {}
    out = {_label(rank, device): node for rank, device, node in db.execute(
        "SELECT rank, device, node FROM metrics WHERE job = ? AND time >= ? ORDER BY time",
        [job, newest[0] - LATEST_WINDOW_S])}
    out.pop("job", None)
    return out


def _rank0_step_at(db: sqlite3.Connection, job: str, t: float) -> float | None:
    """`records.rank0_step_at`: rank 0's newest step sample at or before `t`."""
    found = db.execute("SELECT value FROM metrics WHERE job = ? AND name = ? AND rank = 0 AND "
                       "time <= ? ORDER BY time DESC LIMIT 1", [job, STEP_METRIC, t]).fetchone()
    return None if found is None else float(found[0])


def _model_state(db: sqlite3.Connection, job: str) -> dict[int, dict[str, float]]:
    """`jobs.model_state`: each rank's latest model-state bytes."""
    marks = ",".join("?" * len(MODEL_STATE_METRICS))
    out: dict[int, dict[str, float]] = {}
    for rank, name, value in db.execute(
            f"SELECT rank, name, value FROM metrics WHERE job = ? AND name IN ({marks}) "
            "ORDER BY time", [job, *MODEL_STATE_METRICS]):
        out.setdefault(rank, {})[name] = value
    return out
