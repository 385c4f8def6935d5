"""The statuses a job and a cluster move through, as types.

They are `StrEnum`s because the store, the JSON API and the dashboard keep them as the plain
words they always were ("running", "succeeded"): a member compares equal to its word, so rows
read back from the store need no conversion, and a typo in code is a mypy error rather than a
job stuck in a status nothing looks for.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """starting -> running (-> restarting | resizing -> running)* -> one of the final four."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"  # a failure is being retried (backing off, then a new run)
    RESIZING = "resizing"  # the workers were asked to save and exit for a new size
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # by the user (gpufleet stop, Ctrl-C, SIGTERM)
    INTERRUPTED = "interrupted"  # the supervisor died, or Ctrl-C in the foreground

    @property
    def active(self) -> bool:
        return self in JOB_ACTIVE

    @property
    def final(self) -> bool:
        return self in JOB_FINAL


class ClusterStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPED = "stopped"

    @property
    def active(self) -> bool:
        return self in CLUSTER_ACTIVE


class QueueStatus(StrEnum):
    """queued -> started (its job record exists from then) | cancelled | refused."""

    QUEUED = "queued"
    STARTED = "started"
    CANCELLED = "cancelled"
    REFUSED = "refused"  # its turn came and it could not start (the reason says why)


JOB_ACTIVE: tuple[JobStatus, ...] = (JobStatus.STARTING, JobStatus.RUNNING, JobStatus.RESTARTING,
                                     JobStatus.RESIZING)
JOB_FINAL: tuple[JobStatus, ...] = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED,
                                    JobStatus.INTERRUPTED)
CLUSTER_ACTIVE: tuple[ClusterStatus, ...] = (ClusterStatus.PENDING, ClusterStatus.RUNNING)


CTRL_C_EXIT = 130  # what a shell reports for a command ended by Ctrl-C (128 + SIGINT)


def exit_code(status: str, ctrl_c: bool = False) -> int:
    """What a command that waited for a job's end exits with (`run`, `logs -f`): 0 when the
    job succeeded; 130 when Ctrl-C ended the wait (what a shell reports after it); else 1
    (failed, stopped, interrupted, or it left the queue without starting). One mapping, so a
    script gets the same answer whichever command it waited with."""
    if status == JobStatus.SUCCEEDED:
        return 0
    return CTRL_C_EXIT if ctrl_c else 1
