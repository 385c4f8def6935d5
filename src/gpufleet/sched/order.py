"""The queue's order: priority first, then first come first served, with fair share.

Fair share is a handicap on the submission time: every recent GPU-hour a user consumed moves
their waiting jobs `weight_s` seconds back (default one hour per GPU-hour). One user's jobs keep
their submission order among themselves (the handicap is the same for all of them); between two
users at the same priority, the one who used less lately goes first once the gap in use outweighs
the gap in submission time. Use decays with a half-life, so a busy week is forgiven.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufleet.sched.model import Waiting

WEIGHT_S_PER_GPU_HOUR = 3600.0
HALF_LIFE_S = 24 * 3600.0


@dataclass(frozen=True)
class Use:
    """Devices a user held from `start` to `end` (None: still holding them)."""

    user: str
    devices: int
    start: float
    end: float | None


def recent_gpu_hours(uses: Iterable[Use], now: float,
                     half_life_s: float = HALF_LIFE_S) -> dict[str, float]:
    """Each user's GPU-hours, each hour weighed by 0.5 ** (its age / half-life) (exactly: the
    integral of the decay over the interval, so a long job's old hours count less)."""
    import math

    k = math.log(2) / half_life_s
    out: dict[str, float] = {}
    for u in uses:
        end = now if u.end is None else min(u.end, now)
        if end <= u.start:
            continue
        # integral over [start, end] of exp(-k (now - t)) dt, in hours
        weighed = (math.exp(-k * (now - end)) - math.exp(-k * (now - u.start))) / k / 3600.0
        out[u.user] = out.get(u.user, 0.0) + u.devices * weighed
    return out


def ordered(waiting: Sequence[Waiting], usage: Mapping[str, float],
            weight_s: float = WEIGHT_S_PER_GPU_HOUR) -> list[Waiting]:
    """Waiting jobs in the order they get their turn."""
    return sorted(waiting, key=lambda w: (-w.priority,
                                          w.submitted_at + weight_s * usage.get(w.user, 0.0),
                                          w.submitted_at, w.name))
