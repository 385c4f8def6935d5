"""`--after JOB` on the store: where the job another one runs after stands (the words the pure
rule in `sched.after` reads), and the check at submission.

A job's status is its record's once it has one; before that, its queue entry's (queued,
started, cancelled, refused). Only one's own jobs may be named (an admin: anyone's), and the
refusal for another user's job is the same as for a job that does not exist: a user does not
learn other users' job names by trying them.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select

from gpufleet.errors import SpecError
from gpufleet.lifecycle.accounts import Identity
from gpufleet.sched import after as rule
from gpufleet.store import Job, QueuedJob, Store


def _found(store: Store, names: set[str]) -> dict[str, tuple[str, str | None]]:
    """(status, owner) of each named job that is on record."""
    if not names:
        return {}
    with store.read() as s:
        entries = {n: (st, u) for n, st, u in s.execute(
            select(QueuedJob.name, QueuedJob.status, QueuedJob.user)
            .where(QueuedJob.name.in_(names)))}
        records = {n: (st, u) for n, st, u in s.execute(
            select(Job.name, Job.status, Job.user).where(Job.name.in_(names)))}
    return {**entries, **records}  # a job's record, once there is one, says where it stands


def states(store: Store, names: Iterable[str | None]) -> dict[str, str | None]:
    """The status of each named job (None: no record of it), for `sched.plan`."""
    wanted = {n for n in names if n}
    found = _found(store, wanted)
    return {n: found[n][0] if n in found else None for n in wanted}


def check(store: Store, after: str, who: Identity) -> str:
    """The status of the job a new job is to run after; refused (one `after:` line) when there
    is no such job of the caller's, or it can never succeed now."""
    found = _found(store, {after}).get(after)
    if found is None or not (who.admin or found[1] == who.user):
        mine = "" if who.admin else " of yours"
        raise SpecError([("after", f"no job{mine} named '{after}' (gpufleet jobs lists them); "
                          "--after names a job that is queued, running or succeeded")])
    never = rule.never(after, found[0])
    if never is not None:
        raise SpecError([("after", f"{never}, so this job could never start")])
    return found[0]
