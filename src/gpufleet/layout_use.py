"""Whether gpufleet applied a job's layout, or the script ran as written: what a job records
and shows. Pure and stdlib-only but for `vocab`, a leaf (the fast `status` path reads it
without Pydantic).

A layout is gpufleet's only when the script calls `gpufleet.train.prepare`; anything else runs
as the script wrote it, whatever flags were given. The worker bootstrap tells which at the first
optimizer step (see bootstrap/layout_seen.py), and the job stores it in `Job.layout_seen`:
"applied", or "own:KIND" with KIND what the script built itself.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from gpufleet.vocab import ACCELERATE_STRATEGIES


class Seen(StrEnum):
    APPLIED = "applied"
    OWN = "own"


OWN_WORDS = {
    "ddp": "the script's own DDP",
    "fsdp": "the script's own FSDP (FullyShardedDataParallel)",
    "fsdp2": "the script's own FSDP2 (fully_shard)",
    "tp": "the script's own tensor parallel (parallelize_module)",
    "fsdp2+tp": "the script's own FSDP2 with tensor parallel (2-D)",
    "dtensor": "the script's own DTensor layout",
    "deepspeed": "the script's own DeepSpeed engine",
    "none": "no DDP/FSDP wrapper gpufleet can see",
    "single": "no process group: each rank trains alone",
}


def stored(applied: bool, own: str | None) -> str:
    """The `Job.layout_seen` value for a 'layout' note."""
    if applied:
        return Seen.APPLIED.value
    return f"{Seen.OWN.value}:{own if own in OWN_WORDS else 'none'}"


def flags_given(spec_json: str) -> bool:
    """Whether the job asked for a layout gpufleet applies (a strategy other than plain DDP, a
    mesh, mixed precision, or DeepSpeed): what would not happen in a script without prepare."""
    try:
        spec: dict[str, Any] = json.loads(spec_json)
    except ValueError:
        return False
    framework, strategy = spec.get("framework"), spec.get("strategy") or "ddp"
    if framework == "deepspeed":
        return True
    meshed = any(isinstance(spec.get(d), int) and spec[d] > 1 for d in ("tp", "pp"))
    if framework == "accelerate" and not meshed and strategy in ACCELERATE_STRATEGIES:
        return False  # Accelerate applies these (and the precision) from gpufleet's config
    return meshed or strategy != "ddp" or spec.get("precision") not in (None, "fp32")


def describe(requested: str | None, seen: str | None, spec_json: str, ended: bool) -> str | None:
    """The layout as `status`, the summary and the dashboard show it. `requested`: the spec's
    layout in words ("fsdp, dp=2 x tp=1 x pp=1, fp32, torchrun")."""
    if seen == Seen.APPLIED:
        return f"{requested} (applied by gpufleet)" if requested else "applied by gpufleet"
    if seen is not None and seen.startswith(Seen.OWN + ":"):
        own = OWN_WORDS.get(seen.split(":", 1)[1], OWN_WORDS["none"])
        text = f"as written: {own}"
        if flags_given(spec_json) and requested:
            text += f"; requested {requested} not applied (no gpufleet.train.prepare)"
        return text
    if requested is None:
        return None
    # nothing observed: a job of an older version, or --no-bootstrap; not a claim either way
    return f"{requested} (requested{'' if ended else '; not confirmed yet'})"


def note(applied: bool, own: str | None, layout: str | None, world: int,
         requested: str | None, spec_json: str) -> str:
    """The 'layout' job event's text, at the first step."""
    if applied:
        return f"gpufleet applied {layout or requested} on {world} rank(s) (prepare called)"
    text = f"the script runs as written: {OWN_WORDS.get(own or 'none', OWN_WORDS['none'])}" \
           f" on {world} rank(s)"
    if flags_given(spec_json) and requested:
        text += (f"; the requested {requested} is not applied: the script does not call"
                 " gpufleet.train.prepare")
    return text
