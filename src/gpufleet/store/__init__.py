"""Durable state: clusters, device reservations, jobs and their runs, job events, metric
samples, diagnoses; the queue, users, teams, quotas, the audit trail and the ledger."""

from gpufleet.store.db import Store, gpufleet_home
from gpufleet.store.models import (
    AuditEvent,
    Budget,
    Cluster,
    Diagnosis,
    Event,
    Job,
    JobRun,
    LedgerRow,
    Metric,
    Pool,
    QueuedJob,
    Quota,
    Reservation,
    Team,
    User,
)

__all__ = ["AuditEvent", "Budget", "Cluster", "Diagnosis", "Event", "Job", "JobRun", "LedgerRow", "Metric",
           "Pool", "QueuedJob", "Quota", "Reservation", "Store", "Team", "User", "gpufleet_home"]
