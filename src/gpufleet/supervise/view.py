"""What a user sees about a job, computed from its records. Pure: `now` is passed in.

The live view during `run`, `status` and `status --json` all go through `job_view`, so they agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpufleet.plan import cost
from gpufleet.store import Cluster, Job


@dataclass(frozen=True)
class JobView:
    job: str
    cluster: str
    gpu: str
    status: str
    world_size: int
    step: int | None
    total_steps: int | None
    loss: float | None
    first_loss: float | None
    samples: int
    samples_per_s: float | None
    elapsed_s: float
    eta_s: float | None
    cost_usd: float
    usd_per_hour: float
    price_book: str | None
    reason: str | None
    exit_code: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def seconds_per_step(job: Job) -> float | None:
    """Mean step time since the first report (which marks the end of step 1)."""
    if job.step is None or job.step <= 1 or job.first_step_at is None or job.last_report_at is None:
        return None
    return (job.last_report_at - job.first_step_at) / (job.step - 1)


def job_view(job: Job, cluster: Cluster, now: float) -> JobView:
    start = job.started_at or job.created_at
    end = job.ended_at or now
    eta = None
    sps = seconds_per_step(job)
    if job.status in ("starting", "running") and sps is not None and job.total_steps:
        eta = max(0, job.total_steps - (job.step or 0)) * sps
    return JobView(
        job=job.name, cluster=cluster.name, gpu=cluster.gpu, status=job.status,
        world_size=job.world_size, step=job.step, total_steps=job.total_steps, loss=job.loss,
        first_loss=job.first_loss, samples=job.samples, samples_per_s=job.samples_per_s,
        elapsed_s=max(0.0, end - start), eta_s=eta,
        cost_usd=cost.accrued_usd(cluster.usd_per_hour, cluster.started_at, cluster.stopped_at, now),
        usd_per_hour=cluster.usd_per_hour, price_book=cluster.price_book,
        reason=job.reason, exit_code=job.exit_code,
    )
