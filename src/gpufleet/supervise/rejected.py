"""Datagrams the report socket dropped (no valid signature, or replayed), and when to tell the
job's events about them. Pure.

Forged datagrams are a sign someone else on the machine is poking at the job, worth one line in
its events; but one event per datagram would let the forger fill the store, so the count is
told at the first drop, then at most once every `NOTE_EVERY_S` while more arrive, and once more
at the end for what arrived since.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufleet.reportauth import Rejection
from gpufleet.supervise.events import RecordEvent

NOTE_EVERY_S = 300.0
KIND = "reports_rejected"


@dataclass(frozen=True)
class Dropped:
    unsigned: int = 0
    bad_tag: int = 0
    replayed: int = 0
    noted: int = 0  # the total the events have told so far
    noted_at: float | None = None

    @property
    def total(self) -> int:
        return self.unsigned + self.bad_tag + self.replayed


def count(d: Dropped, why: Rejection) -> Dropped:
    return replace(d, **{why.value: getattr(d, why.value) + 1})


def note(d: Dropped, now: float, final: bool = False) -> tuple[Dropped, RecordEvent | None]:
    """The event telling the drops not told yet, if one is due at `now` (`final`: the run is
    over, tell what is left)."""
    new = d.total - d.noted
    if new == 0 or (not final and d.noted_at is not None and now - d.noted_at < NOTE_EVERY_S):
        return d, None
    parts = [f"{n} {what}" for n, what in ((d.unsigned, "unsigned"),
                                           (d.bad_tag, "with a bad signature"),
                                           (d.replayed, "replayed")) if n]
    text = (f"{new} report datagram(s) dropped ({d.total} so far: {', '.join(parts)}): only the "
            "job's own processes hold its report key; something else on this machine is "
            "sending to the job's report port")
    return replace(d, noted=d.total, noted_at=now), RecordEvent(KIND, text)
