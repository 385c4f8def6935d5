"""The one list of metric names, units and scopes.

A sample is `(time, cluster, job, node, rank, device, name, value)`. The same `name` is the
column value in the store, the key in the JSON API and, prefixed with `gpufleet_`, the
Prometheus metric, so a number can be followed from the worker to a Grafana panel unchanged.
Units are in the name (`_seconds`, `_bytes`, `_usd`, `_watts`, `_celsius`), as the
Prometheus naming guide asks; utilization is a 0..1 ratio (DCGM reports a percentage; we divide).

Scopes decide the labels: a device sample has a `device` id and, in the rank column, the
device's position in the job (the local rank that uses it); a rank sample has its rank and no
device; a job sample has rank -1 and no device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["device", "rank", "job", "cluster"]

JOB_RANK = -1  # the rank column of the whole job's samples
# each report's step, stored as a rank's sample beside the report's others (same time and
# rank): what the dashboard's step axis places every sample by (web/data.py)
STEP_METRIC = "step"


@dataclass(frozen=True)
class MetricDef:
    name: str
    scope: Scope
    help: str
    unit: str


_DEFS = [
    # devices: NVML on GPUs; on CPU the "device" is a worker's CPU slot, measured with psutil
    MetricDef("gpu_utilization", "device",
              "Share of the last second the device was busy (GPU: NVML utilization.gpu; CPU slot:"
              " the worker's CPU time over the cores it was given)", "ratio"),
    MetricDef("gpu_memory_used_bytes", "device",
              "Device memory in use (GPU: NVML; CPU slot: resident memory of the worker and its "
              "data-loader processes)", "bytes"),
    MetricDef("gpu_memory_total_bytes", "device",
              "Device memory size (CPU slot: the host's memory divided among the slots)", "bytes"),
    MetricDef("gpu_power_watts", "device", "Board power draw (NVML)", "watts"),
    MetricDef("gpu_temperature_celsius", "device", "GPU core temperature (NVML)", "celsius"),
    MetricDef("gpu_nvlink_bytes_per_second", "device",
              "NVLink traffic, sent plus received, over the last second (NVML field values)",
              "bytes/s"),
    MetricDef("gpu_pcie_bytes_per_second", "device",
              "PCIe traffic, sent plus received (NVML PCIe throughput counters)", "bytes/s"),
    # ranks: reported by the in-worker SDK (gpufleet.train.report)
    MetricDef("step_time_seconds", "rank", "Wall time per training step on this rank", "seconds"),
    MetricDef("data_wait_seconds", "rank",
              "Time per step spent waiting for the next batch from the data loader", "seconds"),
    MetricDef("comm_seconds", "rank",
              "Time per step with gradient communication in flight (DDP communication hook)",
              "seconds"),
    MetricDef("comm_bytes", "rank", "Bytes all-reduced per step by this rank", "bytes"),
    MetricDef("comm_bandwidth_bytes_per_second", "rank",
              "Achieved all-reduce bus bandwidth: bytes x 2(n-1)/n over the communication time",
              "bytes/s"),
    MetricDef("loss", "rank", "Training loss as the script reported it", "1"),
    MetricDef("loss_scale", "rank", "fp16 dynamic loss scale", "1"),
    MetricDef("skipped_steps", "rank",
              "Optimizer steps skipped so far because fp16 gradients overflowed", "1"),
    MetricDef("memory_allocated_bytes", "rank", "CUDA memory allocated by this rank now", "bytes"),
    MetricDef("params_bytes", "rank", "Parameter bytes this rank holds", "bytes"),
    MetricDef("grads_bytes", "rank", "Gradient bytes this rank holds", "bytes"),
    MetricDef("optimizer_bytes", "rank", "Optimizer-state bytes this rank holds", "bytes"),
    MetricDef("cuda_max_allocated_bytes", "rank", "Peak CUDA memory allocated by this rank",
              "bytes"),
    # the job: computed by the supervisor and the view
    MetricDef("job_samples_per_second", "job", "Training throughput over the last 10 s", "samples/s"),
    MetricDef("job_step", "job", "Last step rank 0 reported", "1"),
    MetricDef("job_loss", "job", "Last loss rank 0 reported", "1"),
    MetricDef("job_cost_usd", "job", "What the job has cost so far", "usd"),
    MetricDef("job_projected_cost_usd", "job",
              "Cost so far plus the cluster's rate over the ETA", "usd"),
    MetricDef("job_eta_seconds", "job", "Estimated time to the last step", "seconds"),
    MetricDef("job_running", "job", "1 while the job is starting or running, else 0", "1"),
    MetricDef("job_findings", "job", "Active diagnosis findings, by severity", "1"),
    MetricDef("cluster_cost_usd", "cluster", "What the cluster has cost since it started", "usd"),
    MetricDef("cluster_usd_per_hour", "cluster", "The cluster's billing rate", "usd/h"),
    MetricDef("cluster_devices", "cluster", "Devices the cluster holds", "1"),
]

METRICS: dict[str, MetricDef] = {d.name: d for d in _DEFS}
DEVICE_METRICS = tuple(d.name for d in _DEFS if d.scope == "device")
RANK_METRICS = tuple(d.name for d in _DEFS if d.scope == "rank")
PROMETHEUS_PREFIX = "gpufleet_"
# what a rank holds for its model, the `status` memory breakdown (the latest of each per rank)
MODEL_STATE_METRICS = ("params_bytes", "grads_bytes", "optimizer_bytes", "cuda_max_allocated_bytes")


def scope_of(name: str) -> Scope:
    """The scope of a stored name; a metric a script invented (report(..., foo=1.0)) is a rank's."""
    d = METRICS.get(name)
    return d.scope if d else "rank"


def prometheus_name(name: str) -> str:
    return PROMETHEUS_PREFIX + name
