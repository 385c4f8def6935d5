"""`/metrics` in the Prometheus text format, built from the store at each scrape.

Running jobs export everything; a job that ended in the last 5 minutes only its outcome
(`job_running` 0, cost, step, loss, projected cost, findings), no device or rank gauges.

Names are `gpufleet_` + the schema's names (telemetry/schema.py), in the style of DCGM's
exporter (`DCGM_FI_DEV_GPU_UTIL` becomes `gpufleet_gpu_utilization`, a 0..1 ratio). The job's
name is the label `gpufleet_job`, not `job`: Prometheus sets `job` itself on every scrape and
would rename ours to `exported_job`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gpufleet.lifecycle import jobs
from gpufleet.store import Store
from gpufleet.telemetry import records
from gpufleet.telemetry.schema import METRICS, prometheus_name, scope_of
from gpufleet.web import data

RECENT_S = 300.0  # a job that ended this recently is still exported, so a scrape sees its end
# What an ended job still exports for those 5 minutes: its outcome, as figures that stay true.
# Its device and rank gauges and its rates (samples/s, ETA) stop at the end: the devices may
# already run the next job, and `sum by (gpu)` would count them twice.
ENDED_JOB_FIGURES = ("job_step", "job_loss", "job_projected_cost_usd")


def _help(name: str) -> str:
    d = METRICS.get(name)
    return d.help if d else f"{name}, as the training script reported it"


class StoreCollector(Collector):
    """`user`: only that user's jobs and the clusters they ran on (a team server's user)."""

    def __init__(self, store: Store, user: str | None = None):
        self.store = store
        self.user = user

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        fams: dict[str, GaugeMetricFamily] = {}

        def fam(name: str, labels: list[str]) -> GaugeMetricFamily:
            if name not in fams:
                fams[name] = GaugeMetricFamily(prometheus_name(name), _help(name), labels=labels)
            return fams[name]

        for cd in data.all_clusters(self.store, now, active_only=True, user=self.user):
            labels = [cd["name"], cd["gpu"], cd["network"]]
            names = ["cluster", "gpu_type", "network"]
            fam("cluster_cost_usd", names).add_metric(labels, cd["cost_usd"])
            fam("cluster_usd_per_hour", names).add_metric(labels, cd["usd_per_hour"])
            fam("cluster_devices", names).add_metric(labels, cd["count"])
        for j, c, v in data.views(self.store, now, since=now - RECENT_S, user=self.user):
            jl = [c.name, j.name]
            job_labels = ["cluster", "gpufleet_job"]
            running = j.status in jobs.ACTIVE
            fam("job_running", job_labels).add_metric(jl, 1.0 if running else 0.0)
            fam("job_cost_usd", job_labels).add_metric(jl, v.cost_usd)
            for name, value in (("job_samples_per_second", v.samples_per_s),
                                ("job_step", v.step), ("job_loss", v.loss),
                                ("job_eta_seconds", v.eta_s),
                                ("job_projected_cost_usd", v.projected_cost_usd)):
                if value is not None and (running or name in ENDED_JOB_FIGURES):
                    fam(name, job_labels).add_metric(jl, float(value))
            severities = {"critical": 0, "warning": 0, "info": 0}
            for f in records.findings(self.store, j.id):
                if f["active"]:
                    severities[f["severity"]] = severities.get(f["severity"], 0) + 1
            for sev, n in severities.items():
                fam("job_findings", [*job_labels, "severity"]).add_metric([*jl, sev], n)
            if not running:  # its devices and ranks are no longer its: no readings of them
                continue
            nodes = records.nodes(self.store, j.name)
            for series_label, values in records.latest(self.store, j.name).items():
                node = nodes.get(series_label, "local")
                for name, value in values.items():
                    scope = scope_of(name)
                    if series_label.startswith("rank "):
                        fam(name, [*job_labels, "node", "rank"]).add_metric(
                            [*jl, node, series_label[5:]], value)
                    elif scope == "device":
                        fam(name, [*job_labels, "node", "gpu", "gpu_type"]).add_metric(
                            [*jl, node, series_label, c.gpu], value)
        yield from fams.values()


def registry(store: Store, user: str | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store, user))
    return reg
