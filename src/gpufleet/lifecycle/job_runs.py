"""A job's runs on the store (`JobRun`): opened and closed inside the write transaction that
creates, resumes or ends the job, or stops its cluster, so the readings of the cluster's cost
meter that `plan.billing` splits the cost by are the ones of that moment.

A job that died with its supervisor (kill -9) has its run closed by `reconcile`, which ends
the job and stops its cluster: the store alone says what it cost, whether or not anything
booked the ledger meanwhile.
"""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.plan import billing
from gpufleet.status import CLUSTER_ACTIVE
from gpufleet.store import Cluster, Job, JobRun


def open_run(s: Session, job: Job, c: Cluster, now: float, fresh: bool) -> None:
    """Start a run of `job` on `c` at `now` (the job has no open run); `fresh`: `c` was made
    for this run of the job, so the run counts from the cluster's first second."""
    assert job.run_from_micro_usd is None
    start, reading = billing.run_start(c, now, fresh)
    job.run_from_micro_usd = reading
    s.add(JobRun(job_id=job.id, cluster_id=c.id, start=start, from_micro_usd=reading))


def close_run(s: Session, job: Job, c: Cluster, at: float) -> None:
    """End the job's open run at `at` and add what it cost to the job's."""
    if job.run_from_micro_usd is None:
        return
    reading = billing.meter_micro(c, at)
    run = s.scalar(select(JobRun).where(JobRun.job_id == job.id, JobRun.end.is_(None))
                   .order_by(JobRun.id.desc()))
    if run is not None:
        run.end, run.to_micro_usd = max(run.start, at), reading
    job.billed_micro_usd = (job.billed_micro_usd or 0) + reading - job.run_from_micro_usd
    job.run_from_micro_usd = None


def job_ended(s: Session, job: Job, now: float) -> None:
    """The job has just ended: its run ends now, unless it is on a cluster made for it that
    goes when the job goes (not `--keep`): that run ends with the cluster (`cluster_stopped`),
    so the cluster's clean-up after the job is the job's cost too."""
    c = s.get(Cluster, job.cluster_id)
    if c is None or job.run_from_micro_usd is None:
        return
    if c.for_job == job.name and c.status in CLUSTER_ACTIVE and not _keeps(job.spec_json):
        return
    close_run(s, job, c, now)


def cluster_stopped(s: Session, c: Cluster) -> None:
    """The cluster has just stopped: every run still open on it ends at its stop."""
    assert c.stopped_at is not None
    for job in s.scalars(select(Job).where(Job.cluster_id == c.id,
                                           Job.run_from_micro_usd.is_not(None))):
        close_run(s, job, c, c.stopped_at)


def _keeps(spec_json: str) -> bool:
    """The job's `keep` (its cluster outlives it), read without validating the whole spec."""
    try:
        return bool(json.loads(spec_json).get("keep"))
    except (ValueError, AttributeError):
        return False
