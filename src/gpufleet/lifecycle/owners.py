"""Who holds a reservation while a job starts, and what a holder's death leaves to undo.

A `gpufleet run` reserves devices (a cluster made for the job), then creates the job record, then
starts the supervisor and records its pid. Until that last write, no supervisor exists whose death
`reconcile` could notice, so the process that made the rows is recorded as their holder: the
cluster's `owner_pid` and the job's `creator_pid`, each with the process's start time (a pid is
reused; a pid with another start time is another process). When the supervisor is recorded the
cluster is handed to it (its owner is cleared), so from then on the supervisor's death is what
counts. A `run` killed at any point of its start-up (SIGHUP while it waits for the store's write
lock, kill -9) therefore leaves rows whose holder is dead, and the next command frees them.

The decision is pure (`orphaned`); looking processes up is `alive`, at the edge.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Holder:
    """A process, named so that a reused pid is not mistaken for it."""

    pid: int
    started: float | None  # psutil create_time; None if it could not be read

    def describe(self) -> str:
        return f"pid {self.pid}"


@dataclass(frozen=True)
class StartingJob:
    """A job record as `orphaned` needs it."""

    id: int
    cluster_id: int
    active: bool
    creator: Holder | None  # None: made by a version that did not record it
    supervisor: Holder | None
    supervisor_alive: bool


@dataclass(frozen=True)
class HeldCluster:
    """An active cluster whose rows a process is still setting up (owner not yet cleared)."""

    id: int
    owner: Holder


@dataclass(frozen=True)
class Orphans:
    """What a dead holder left: jobs to mark interrupted (with why) and clusters to free."""

    jobs: dict[int, str]
    clusters: dict[int, str]


def orphaned(jobs: Sequence[StartingJob], held: Sequence[HeldCluster],
             alive: Callable[[Holder], bool]) -> Orphans:
    """The jobs that never got a supervisor and whose creator is gone, and the clusters whose
    owner is gone before handing them to a live supervisor.

    A cluster with an active job whose supervisor lives is left alone even if its owner died (the
    hand-over write may not have landed yet when we read); a job whose supervisor is recorded is
    `reconcile`'s usual case, not this one.
    """
    out_jobs: dict[int, str] = {}
    for j in jobs:
        if j.active and j.supervisor is None and j.creator is not None and not alive(j.creator):
            out_jobs[j.id] = (f"the process that started it ({j.creator.describe()}) ended before "
                              "its supervisor started")
    supervised = {j.cluster_id for j in jobs if j.active and j.supervisor_alive}
    out_clusters: dict[int, str] = {}
    for c in held:
        if c.id not in supervised and not alive(c.owner):
            out_clusters[c.id] = (f"the process that reserved it ({c.owner.describe()}) ended "
                                  "before its job's supervisor started")
    return Orphans(out_jobs, out_clusters)


def me() -> Holder:
    """This process, as a holder."""
    return Holder(os.getpid(), started_of(os.getpid()))


def started_of(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def alive(h: Holder) -> bool:
    """The process still exists (a zombie, killed but not yet reaped, counts as gone) and it is
    the same process (its start time matches to within a second)."""
    try:
        p = psutil.Process(h.pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return h.started is None or abs(p.create_time() - h.started) < 1
    except psutil.Error:
        return False
