"""Which of the dashboard's figures a job's script does not produce, and why. Pure, stdlib only.

A chart that waits for a figure that never comes ("waiting for the first step" on the
communication charts of a script that builds its own DDP) misleads: it says "not measured for
this script" and why instead, in the words docs/watching.md uses for what each figure needs.
Only what is certain from the job's record is claimed: the layout the first step showed
(`layout_use`), the job's size and spec, and reports that came without a batch size.
"""

from __future__ import annotations

import functools
import json

from gpufleet import layout_use

COMM = ("comm_seconds", "comm_bandwidth_bytes_per_second")
THROUGHPUT = ("job_samples_per_second",)
HOOKED = ("ddp", "zero1")  # the data-parallel methods DDP's communication hook times

_HOOK = ("communication time is measured by the DDP hook gpufleet.train.prepare installs, for "
         "ddp and zero1")
NO_PREPARE = f"the script does not call gpufleet.train.prepare: {_HOOK}"
NO_HOOK = f"{_HOOK}; FSDP, tensor and pipeline parallelism have no such hook"
DEEPSPEED = f"DeepSpeed's engine reduces the gradients itself: {_HOOK}"
ONE_WORKER = "one worker: there is no gradient all-reduce to time"
NO_SAMPLES = ("its steps come without a batch size: samples/s counts the batches the script's "
              "DataLoaders yield, or train.report(step, samples=N); without a DataLoader "
              "(nanoGPT) it is unknown, not 0")


def not_measured(spec_json: str, world_size: int, layout_seen: str | None, step: int | None,
                 first_step: int | None, samples: int) -> dict[str, str]:
    """Chart metric -> why this job's script does not produce it; the rest are expected.
    `step`, `first_step`: rank 0's latest and first reported step of this run (None before
    one); `samples`: the samples counted so far."""
    out: dict[str, str] = {}
    comm = _comm(spec_json, world_size, layout_seen, step is not None)
    if comm is not None:
        out.update(dict.fromkeys(COMM, comm))
    two_reports = step is not None and first_step is not None and step > first_step
    if two_reports and samples == 0:
        out.update(dict.fromkeys(THROUGHPUT, NO_SAMPLES))
    return out


@functools.lru_cache(maxsize=256)
def _comm(spec_json: str, world_size: int, layout_seen: str | None, reported: bool) -> str | None:
    # Cached: the live view asks four times a second with the same spec.
    if world_size <= 1:
        return ONE_WORKER
    if layout_seen is not None and layout_seen.startswith(layout_use.Seen.OWN + ":"):
        own = layout_use.OWN_WORDS.get(layout_seen.split(":", 1)[1], layout_use.OWN_WORDS["none"])
        return f"the script runs as written ({own}): {_HOOK}"
    if layout_seen == layout_use.Seen.APPLIED:
        return _applied(spec_json)
    # prepare says it was called before the first step; reports without that: it was not
    return NO_PREPARE if reported else None


def _applied(spec_json: str) -> str | None:
    """For a layout gpufleet applied: whether its data parallelism is one DDP's hook times."""
    try:
        spec = json.loads(spec_json)
    except (ValueError, TypeError):  # no spec, or one that is not JSON: claim nothing
        return None
    if not isinstance(spec, dict):
        return None
    if spec.get("framework") == "deepspeed":
        return DEEPSPEED
    meshed = any(isinstance(spec.get(d), int) and spec[d] > 1 for d in ("tp", "pp"))
    if meshed or (spec.get("strategy") or "ddp") not in HOOKED:
        return NO_HOOK
    return None
