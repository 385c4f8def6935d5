"""Where the durable copy of a job's checkpoints stands, read from the job's events. Pure.

A copy to `--checkpoint-to` runs in the background and may fail (a full volume, a permission)
while training goes on and the job still succeeds: without a word, a user would trust a
durable copy many steps old. Each copy becomes an event (`checkpoint_copied`,
`checkpoint_copy_failed`, written by `copied_text` / `failed_text` here, which `state` reads
back), so `status`, `status --json` and the dashboard tell from the events alone which step
the durable copy has and whether a newer one failed to get there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class CopyEvent(StrEnum):
    COPIED = "checkpoint_copied"
    FAILED = "checkpoint_copy_failed"
    BEHIND = "checkpoint_copy_behind"  # recorded once when a job ends with its copy behind


_STEP = re.compile(r"step (\d+)(?:: (.*))?", re.DOTALL)


def copied_text(step: int | None, path: str) -> str:
    return f"step {step} copied to {path}"


def failed_text(step: int | None, why: str) -> str:
    return f"step {step}: {why}"


@dataclass(frozen=True)
class DurableCopy:
    step: int | None  # the newest checkpoint the durable location has (None: none yet)
    failed_step: int | None = None  # a newer checkpoint whose copy failed, if any
    why: str | None = None  # why that copy failed

    @property
    def behind(self) -> bool:
        return self.failed_step is not None

    @property
    def text(self) -> str:
        """What `status` says: "step 20 (behind: step 30 failed: No space left on device)"."""
        has = "no checkpoint yet" if self.step is None else f"step {self.step}"
        if not self.behind:
            return has
        return f"{has} (behind: step {self.failed_step} failed: {self.why})"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "behind": self.behind, "text": self.text}


def state(events: Iterable[tuple[str, str]]) -> DurableCopy | None:
    """The durable copy after these (kind, reason) events, oldest first; None when the job
    never copied (no durable location, or no checkpoint yet)."""
    have: int | None = None
    failed: tuple[int, str] | None = None
    seen = False
    for kind, reason in events:
        if kind not in (CopyEvent.COPIED, CopyEvent.FAILED):
            continue
        m = _STEP.match(reason)
        if m is None:
            continue
        seen, step = True, int(m.group(1))
        if kind == CopyEvent.COPIED:
            have = step if have is None else max(have, step)
            if failed is not None and step >= failed[0]:
                failed = None
        elif have is None or step > have:
            failed = (step, (m.group(2) or "").strip() or "unknown")
    if not seen:
        return None
    return DurableCopy(have, *(failed or (None, None)))


def of_rows(rows: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """`state` of a job detail's event rows ({"kind", "reason", ...}), as JSON."""
    found = state((str(r["kind"]), str(r["reason"])) for r in rows)
    return None if found is None else found.as_dict()
