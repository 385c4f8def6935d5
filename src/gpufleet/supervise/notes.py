"""The workers' lifecycle notes (a checkpoint saved, a resume, a durable copy, a skip) as the
job events they are recorded as, and the typing every number from a datagram goes through. Pure.
"""

from __future__ import annotations

from typing import Any

from gpufleet import durable_copy
from gpufleet.supervise.events import RecordEvent, WorkerNote
from gpufleet.telemetry.wire import EVENT, RANK, opt_number

__all__ = ["note_of", "opt_number"]


def note_of(rec: dict[str, Any], total_steps: int | None = None
            ) -> tuple[WorkerNote, RecordEvent | None]:
    """A Checkpointer note, and the job event it is recorded as (if any). A step past the
    job's planned total (when known) raises ValueError: no real checkpoint is there."""
    kind = str(rec[EVENT])
    step = opt_number(int, rec.get("step"))
    if step is not None and total_steps is not None and step > total_steps:
        raise ValueError(f"step {step} is past the job's {total_steps} steps")
    note = WorkerNote(kind, int(rec[RANK]), step)
    if kind == "checkpoint":
        size = opt_number(float, rec.get("bytes")) or 0.0
        blocked = opt_number(float, rec.get("blocked_s")) or 0.0
        mode = "async" if rec.get("async_save") else "sync"
        return note, RecordEvent("checkpoint", f"step {step} saved ({size / 1e6:.1f} MB, {mode}; "
                                 f"training blocked {blocked:.3f} s)")
    if kind == durable_copy.CopyEvent.COPIED:
        return note, RecordEvent(kind, durable_copy.copied_text(step, str(rec.get("path"))[:300]))
    if kind in ("checkpoint_skipped", durable_copy.CopyEvent.FAILED):
        return note, RecordEvent(kind, durable_copy.failed_text(step, str(rec.get("why"))[:300]))
    if kind == "resumed":
        return note, RecordEvent("resumed", f"from the checkpoint at step {step}")
    if kind == "warm_off":  # a node's launcher could not start its workers warm (launch/warm.py)
        where = f" on {str(rec.get('node'))[:100]}" if rec.get("node") else ""
        return note, RecordEvent(kind, f"workers started cold{where}: {str(rec.get('why'))[:300]}")
    return note, None
