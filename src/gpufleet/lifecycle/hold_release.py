"""`gpufleet hold` and `release`: a queued job that keeps its place in the queue but does not
start until it is released (Slurm's `scontrol hold` / `release`).

Its owner holds and releases their own queued jobs; an admin anyone's. A job an admin held
(someone else's) is the admin's to release, as Slurm keeps an administrator's hold: the owner's
release is refused with who holds it. The hold is recorded at once with its reason, so `jobs`
says "held" before the queue's next pass; the pass (`sched.plan`) then keeps it unstarted.
"""

from __future__ import annotations

import time

from sqlalchemy import update

from gpufleet.errors import ConflictError, ForbiddenError, NotFoundError
from gpufleet.lifecycle import accounts, jobs, queued
from gpufleet.lifecycle.accounts import Identity
from gpufleet.sched.model import Wait
from gpufleet.status import QueueStatus
from gpufleet.store import QueuedJob, Store


def _queued(store: Store, name: str, who: Identity, what: str) -> QueuedJob:
    """The caller's queued entry of that name, or the one error that says why not."""
    e = queued.entry(store, name)
    if e is None:
        if jobs.get_or_none(store, name) is not None:
            raise ConflictError(f"{what}: job '{name}' is not queued (it started); only a "
                                "queued job can be held or released")
        raise NotFoundError(f"job: no queued job named '{name}' (gpufleet jobs)")
    accounts.may_act_on(who, e.user, f"{what} {name}")
    if e.status != QueueStatus.QUEUED:
        raise ConflictError(f"{what}: job '{name}' is {e.status}, not queued; only a queued "
                            "job can be held or released")
    return e


def _set(store: Store, e: QueuedJob, values: dict[str, object], who: Identity, action: str,
         detail: str, now: float) -> None:
    with store.session() as s:
        done = s.execute(update(QueuedJob).where(QueuedJob.id == e.id,
                                                 QueuedJob.status == QueueStatus.QUEUED)
                         .values(**values))
        if getattr(done, "rowcount", 1) == 0:
            raise ConflictError(f"{action}: job '{e.name}' left the queue a moment ago "
                                "(gpufleet jobs --all)")
        accounts.audit(s, who, action, e.name, detail, now)


def hold(store: Store, name: str, who: Identity, now: float | None = None) -> bool:
    """Hold a queued job; False when it was held already (nothing changes)."""
    now = time.time() if now is None else now
    e = _queued(store, name, who, "hold")
    if e.held_by is not None:
        return False
    _set(store, e, {"held_by": who.user, "wait": Wait.HELD.value, "est_start": None,
                    "start_note": "held", "decided_at": now,
                    "reason": f"held: it keeps its place but starts only after gpufleet "
                              f"release {name}"},
         who, "hold", "" if who.user == e.user else f"job of {e.user}", now)
    return True


def release(store: Store, name: str, who: Identity, now: float | None = None) -> bool:
    """Let a held job start in its turn again; False when it was not held."""
    now = time.time() if now is None else now
    e = _queued(store, name, who, "release")
    if e.held_by is None:
        return False
    if e.held_by != e.user and not who.admin:
        raise ForbiddenError(f"release: job '{name}' was held by an admin ({e.held_by}); only "
                             "an admin may release it")
    # its place and estimate come with the queue's next pass (a second)
    _set(store, e, {"held_by": None, "wait": None, "reason": None, "position": None,
                    "start_note": None, "decided_at": now},
         who, "release", "" if who.user == e.user else f"job of {e.user}", now)
    return True
