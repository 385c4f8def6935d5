"""What the dashboard's API and `/metrics` read: the views the CLI shows too (`gpufleet.views`),
so the page, the terminal and Prometheus agree to the cent."""

from __future__ import annotations

from gpufleet.views import all_clusters, cluster_dict, job_detail, job_series, views

__all__ = ["all_clusters", "cluster_dict", "job_detail", "job_series", "views"]
