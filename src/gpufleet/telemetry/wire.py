"""The worker report's wire format, written by the workers and read by the supervisor.

One JSON object per UDP datagram (signed with the job's key, `reportauth`), of three shapes:

- a progress report (`train.report`, and the worker bootstrap's step counts through it):
  `t`, `rank`, `pid`, `step`, optionally `node`, `src`, `loss`, `samples`, `samples_total`,
  `total_steps`, and any further number is a metric (`step_time_seconds`, ...);
- a lifecycle note (`train.report.send_event`: a checkpoint, a resume, the layout seen): `t`,
  `rank`, `pid`, `event` (its kind), optionally `node`, and the note's own fields;
- a node agent's device samples (`backends/ray_run.NodeAgent`, on Ray and Slurm): `node`, `t`,
  `device_samples` as `[key, device, metric, value]` rows.

The builders below are what the senders call and `read_progress` is what the supervisor
(`supervise/intake.py`) calls, so a key cannot be spelled two ways. `node` is the node the
rank ran on as its pool names it in `pool list` (a Ray node's label, a Slurm node's name):
`$GPUFLEET_NODE_ID`, which the multi-node engines set per node (`launch/multinode.py`), and the
label a node agent gives its device samples. A rank on this host sends none and reads back as
`LOCAL`. A leaf, stdlib only: workers import it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_DATAGRAM = 8192  # bytes of JSON, before the signature; a longer record is not sent
NODE_ENV = "GPUFLEET_NODE_ID"
LOCAL = "local"  # the node label of a rank on this host
NODE_CHARS = 32  # a node label is cut to this many characters

T, RANK, PID, NODE = "t", "rank", "pid", "node"
STEP, LOSS, SAMPLES, SAMPLES_TOTAL, TOTAL_STEPS = "step", "loss", "samples", "samples_total", "total_steps"
SRC = "src"
BOOTSTRAP = "bootstrap"  # the SRC of the bootstrap's step counts, and the note it sends when armed
EVENT = "event"
LAYOUT = "layout"  # the note of who set the layout up
DEVICE_SAMPLES = "device_samples"

# Keys of a progress report that are not metrics, whatever their value.
NOT_METRICS = frozenset({T, RANK, PID, NODE, STEP, TOTAL_STEPS, SAMPLES_TOTAL, SRC})


def progress_record(*, t: float, rank: int, pid: int, step: int, node: str | None = None,
                    source: str | None = None, loss: float | None = None,
                    samples: int | None = None, samples_total: int | None = None,
                    total_steps: int | None = None,
                    metrics: Mapping[str, float] | None = None) -> dict[str, Any]:
    """A progress report as it goes on the wire; `metrics` are sent as floats."""
    record: dict[str, Any] = {T: t, RANK: rank, STEP: int(step), PID: pid}
    optional: dict[str, Any] = {NODE: node, SRC: source,
                                LOSS: None if loss is None else float(loss),
                                SAMPLES: None if samples is None else int(samples),
                                SAMPLES_TOTAL: samples_total,
                                TOTAL_STEPS: None if total_steps is None else int(total_steps)}
    record.update({k: v for k, v in optional.items() if v is not None})
    for key, value in (metrics or {}).items():
        record[key] = float(value)
    return record


def note_record(kind: str, *, t: float, rank: int, pid: int | None, node: str | None = None,
                fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A lifecycle note; fields that are None are left out (a node launcher's note has rank
    -1 and no pid: it is no rank's process to sample)."""
    record: dict[str, Any] = {T: t, RANK: rank, EVENT: kind}
    if pid is not None:
        record[PID] = pid
    if node is not None:
        record[NODE] = node
    record.update({k: v for k, v in (fields or {}).items() if v is not None})
    return record


def device_samples_record(node: str, t: float,
                          rows: list[tuple[int, str, str, float]]) -> dict[str, Any]:
    """A node agent's device samples: (key, device, metric, value) rows."""
    return {NODE: node, T: t, DEVICE_SAMPLES: [list(r) for r in rows]}


def encode(record: Mapping[str, Any]) -> bytes | None:
    """The record's bytes, or None when it would not fit in one datagram."""
    data = json.dumps(record, separators=(",", ":")).encode()
    return data if len(data) <= MAX_DATAGRAM else None


def opt_number(kind: type[int] | type[float], value: Any) -> Any:
    """`value` as `kind`, None kept; anything else (a string, a list) raises ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r}")
    return kind(value)


def node_of(record: Mapping[str, Any]) -> str:
    """The node a record came from, as a label: LOCAL when it names none."""
    node = record.get(NODE)
    return str(node)[:NODE_CHARS] if node else LOCAL


@dataclass(frozen=True)
class Progress:
    """A progress report as the supervisor reads it, every field typed."""

    t: float
    rank: int
    step: int
    node: str = LOCAL
    pid: int | None = None
    source: str | None = None
    loss: float | None = None
    samples: int | None = None
    samples_total: int | None = None
    total_steps: int | None = None
    # the numbers besides the known keys, NaN and inf kept (a diagnosis reads them); no bools
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def finite_metrics(self) -> dict[str, float]:
        """What can be stored: SQL has no NaN."""
        return {k: v for k, v in self.metrics.items() if math.isfinite(v)}


def read_progress(record: Mapping[str, Any]) -> Progress:
    """A progress report from its decoded JSON; ValueError, TypeError or KeyError when a field
    is missing or of the wrong type (the supervisor drops such a datagram)."""
    pid = record.get(PID)
    source = record.get(SRC)
    return Progress(
        t=float(record[T]), rank=int(record[RANK]), step=int(record[STEP]), node=node_of(record),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        source=source if isinstance(source, str) else None,
        loss=opt_number(float, record.get(LOSS)), samples=opt_number(int, record.get(SAMPLES)),
        samples_total=opt_number(int, record.get(SAMPLES_TOTAL)),
        total_steps=opt_number(int, record.get(TOTAL_STEPS)),
        metrics={k: float(v) for k, v in record.items()
                 if k not in NOT_METRICS and isinstance(v, int | float) and not isinstance(v, bool)})
