"""A job's runs, restarts and chart markers, read from its events. Pure and stdlib only (the
fast `status` path, `snapshot_job`, reads them without SQLAlchemy).

A run is one start of the workers: the first, each restart after a failure, each resize, and
each `run --resume`. The charts draw one series per run, so a restart without a checkpoint
(its steps count from 1 again) is not joined to the run before it. Every run begins with a
`running` status event (`jobs.begin_running` for the first run of a start or a resume,
`state.start_run`'s transition for the later ones), with one exception: the `running` that ends
an abandoned resize (a `resizing` with no `resized` after it), where the same workers go on.

`MARKER_KINDS` is the one list of event kinds the page draws as a labelled vertical line on
every chart; a new kind is one more entry there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from gpufleet.status import JOB_FINAL, JobStatus

# event kind -> the marker's label on the charts
MARKER_KINDS: dict[str, str] = {
    "restarting": "restart",
    "resized": "resized",
    "scale_blocked": "resize blocked",
    "node_replaced": "node replaced",
    "resize_kept": "resize kept",  # an elastic resize's verdict (supervise/goodput.py)
    "resize_reverted": "resize reverted",
}
# kinds that say a resize really ended the workers: the next `running` is a new run
RESIZED_KINDS = ("resized",)
_STATUSES = frozenset(str(s) for s in JobStatus)
_FINAL = frozenset(str(s) for s in JOB_FINAL)


class Cause(StrEnum):
    """Why a run started."""

    START = "start"
    RESTART = "restart"
    RESIZE = "resize"
    RESUME = "resume"  # `run --resume` of an ended job


@dataclass(frozen=True)
class Run:
    number: int  # 1, 2, ...
    start: float  # UNIX seconds: its `running` event
    cause: Cause


@dataclass(frozen=True)
class Marker:
    time: float
    kind: str  # the event's kind, or "resume" (a run started by `run --resume`)
    label: str
    text: str  # the event's reason
    step: float | None = None  # rank 0's step by then, for the step axis (None: before any)


def runs(events: Iterable[tuple[float, str, str]]) -> list[Run]:
    """The runs of a job from its events, (time, kind, reason) oldest first."""
    out: list[Run] = []
    seen: set[str] = set()  # kinds since the last run began
    resizing = False  # the last status was `resizing` and no resize has ended the workers yet
    for t, kind, _ in events:
        if kind == JobStatus.RUNNING:
            if not resizing:
                out.append(Run(len(out) + 1, t, _cause(seen, first=not out)))
                seen = set()
            resizing = False
            continue
        seen.add(kind)
        if kind == JobStatus.RESIZING:
            resizing = True
        elif kind in RESIZED_KINDS or (kind in _STATUSES and kind != JobStatus.RESIZING):
            resizing = False
    return out


def _cause(seen: set[str], first: bool) -> Cause:
    if first:
        return Cause.START
    if seen & _FINAL:
        return Cause.RESUME
    if seen & set(RESIZED_KINDS):
        return Cause.RESIZE
    return Cause.RESTART if JobStatus.RESTARTING in seen else Cause.START


def current_start(events: Iterable[tuple[float, str, str]]) -> float | None:
    """When the newest run began (None before the first)."""
    found = runs(events)
    return found[-1].start if found else None


def markers(events: Iterable[tuple[float, str, str]],
            kinds: Mapping[str, str] | None = None) -> list[Marker]:
    """Events of `kinds` (kind -> label; `MARKER_KINDS` unless given), and the start of each
    resumed run, oldest first."""
    found, kinds = list(events), MARKER_KINDS if kinds is None else kinds
    out = [Marker(t, kind, kinds[kind], reason) for t, kind, reason in found if kind in kinds]
    out += [Marker(r.start, "resume", "resume", f"run {r.number}: resumed with run --resume")
            for r in runs(found) if r.cause == Cause.RESUME]
    return sorted(out, key=lambda m: m.time)


def restarts(events: Iterable[tuple[float, str, str]]) -> int:
    """How many times the workers were restarted after a failure (or a hang)."""
    return sum(1 for _, kind, _ in events if kind == JobStatus.RESTARTING)


def of_rows(rows: Iterable[Mapping[str, Any]],
            step_at: Callable[[float], float | None]) -> dict[str, Any]:
    """`runs`, `markers` (each with rank 0's step at its time, from `step_at`) and `restarts`
    from event dicts ({"time", "kind", "reason"}), as the job detail carries them."""
    events = [(float(r["time"]), str(r["kind"]), str(r["reason"] or "")) for r in rows]
    marks = [asdict(m) | {"step": step_at(m.time)} for m in markers(events)]
    return {"runs": [asdict(r) for r in runs(events)], "markers": marks,
            "restarts": restarts(events)}
