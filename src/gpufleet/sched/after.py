"""Dependencies between jobs: `--after JOB`, as Slurm's `afterok`. A job waits in the queue
until the job it names succeeded; once that job can no longer succeed (it failed, was stopped
or interrupted, or left the queue without starting), the waiting job can never start, and it
leaves the queue with the reason, where Slurm would keep it pending as
"DependencyNeverSatisfied".

Statuses come in as the plain words the store keeps: a job's status once it has a record, else
its queue entry's, so the scheduler stays pure data in, data out (it could import the status
types of `gpufleet.status`, which sit below every package, but compares words only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpufleet.sched.model import Waiting

SUCCEEDED = "succeeded"
# a queue entry waiting or being started, or a job still running: it may yet succeed
PENDING = frozenset({"queued", "started", "starting", "running", "restarting", "resizing"})


def ready(status: str | None) -> bool:
    """Whether a job run after one in `status` may start now."""
    return status == SUCCEEDED


def never(after: str, status: str | None) -> str | None:
    """Why a job run after `after` (whose status is `status`; None: no record of it) can never
    start, or None while it still may."""
    if status is None:
        return f"job {after}, which it runs after, is no longer on record"
    if status == SUCCEEDED or status in PENDING:
        return None
    return (f"job {after}, which it runs after, ended {status}; --after starts a job only once "
            "that one succeeds")


def waiting_text(after: str, status: str | None) -> str:
    """The reason a job waits for the one it runs after, with where that one is now."""
    where = "still queued" if status in ("queued", "started") else status
    return f"after {after}: starts once {after} succeeds ({after} is {where})"


def doomed(waiting: Sequence[Waiting], states: Mapping[str, str | None]) -> dict[str, str]:
    """The waiting jobs that can never start, each with why: those whose job ended without
    succeeding, and the jobs run after those (a chain fails from its broken link on, in one
    pass). `states`: the status of each job a waiting job runs after."""
    out: dict[str, str] = {}
    queued = {w.name for w in waiting}
    changed = True
    while changed:
        changed = False
        for w in waiting:
            if w.after is None or w.name in out:
                continue
            if w.after in out:
                why: str | None = (f"job {w.after}, which it runs after, can never start "
                                   "(it leaves the queue too)")
            else:
                why = never(w.after, "queued" if w.after in queued else states.get(w.after))
            if why is not None:
                out[w.name] = why
                changed = True
    return out
