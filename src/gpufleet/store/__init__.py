"""Durable state: clusters, device reservations, jobs, job events and metric samples."""

from gpufleet.store.db import Store, gpufleet_home
from gpufleet.store.models import Cluster, Event, Job, Metric, Reservation

__all__ = ["Cluster", "Event", "Job", "Metric", "Reservation", "Store", "gpufleet_home"]
