"""Durable state: clusters, device reservations, jobs, job events, metric samples, diagnoses."""

from gpufleet.store.db import Store, gpufleet_home
from gpufleet.store.models import Cluster, Diagnosis, Event, Job, Metric, Pool, Reservation

__all__ = ["Cluster", "Diagnosis", "Event", "Job", "Metric", "Pool", "Reservation", "Store",
           "gpufleet_home"]
