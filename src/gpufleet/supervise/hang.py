"""Is a running job hung, and which rank is to blame? Pure: report times and process states in.

A rank that dies makes torchrun fail at once; a rank that hangs does not. On GPUs a rank stuck
in a collective blocks its peers inside NCCL until the watchdog's timeout (10 minutes by
default), and a stopped process (SIGSTOP, a debugger, a swapped-out node) blocks them forever
under any backend. Every rank then stops reporting, so "no rank reported for T seconds" is the
signal, and the rank whose process is stopped, or which reported last the longest ago, is the
likely cause.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hang:
    rank: int | None  # the likely culprit, when one can be told apart
    description: str


def find(now: float, last_seen: dict[int, tuple[float, int]], started_at: float,
         timeout_s: float, stopped: dict[int, bool], startup_s: float | None = None) -> Hang | None:
    """`last_seen`: rank -> (time, step) of its latest report in this run of the workers.
    `stopped`: rank -> whether its process is stopped (state T). Before any report, the
    workers get `startup_s` (None: no limit, since a script may never report)."""
    if not last_seen:
        if startup_s is None or now - started_at <= startup_s:
            return None
        return Hang(None, f"no rank reported within {startup_s:.0f} s of starting")
    newest = max(t for t, _ in last_seen.values())
    quiet = now - newest
    if quiet <= timeout_s:
        return None
    frozen = sorted(r for r, s in stopped.items() if s)
    if frozen:
        ranks = ", ".join(str(r) for r in frozen)
        return Hang(frozen[0], f"no rank reported for {quiet:.0f} s (hang timeout "
                    f"{timeout_s:.0f} s); rank {ranks} is stopped (SIGSTOP or a debugger)")
    steps = {r: step for r, (_, step) in last_seen.items()}
    behind = min(steps, key=lambda r: (steps[r], r))
    if steps[behind] < max(steps.values()):
        return Hang(behind, f"no rank reported for {quiet:.0f} s (hang timeout {timeout_s:.0f} s);"
                    f" rank {behind} is behind, at step {steps[behind]} while others reached "
                    f"{max(steps.values())} (stuck in a collective or its data loader)")
    return Hang(None, f"no rank reported for {quiet:.0f} s (hang timeout {timeout_s:.0f} s)")
