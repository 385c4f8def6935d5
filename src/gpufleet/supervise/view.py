"""What a user sees about a job, computed from its records. Pure: `now` is passed in.

The live view during `run`, `status` and `status --json` all go through `job_view`, so they agree.
It takes any object with a job's and a cluster's fields (`JobRecord`, `ClusterRecord`): the
store's rows, or the plain rows `gpufleet.snapshot_job` reads with stdlib `sqlite3`, so this
module imports neither SQLAlchemy nor Pydantic until a stored spec has to be validated.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from gpufleet import layout_use
from gpufleet.plan import billing, cost
from gpufleet.status import JOB_ACTIVE, JobStatus
from gpufleet.supervise import measured

STALE_FLOOR_S = 30.0  # `no_report_s`: the shortest silence called one
STALE_STEPS = 10  # ... or this many mean step times, when longer


class JobRecord(Protocol):
    """The fields of a job row (store.Job) that its view reads."""

    @property
    def name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def spec_json(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def created_at(self) -> float: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def ended_at(self) -> float | None: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def step(self) -> int | None: ...
    @property
    def total_steps(self) -> int | None: ...
    @property
    def samples(self) -> int: ...
    @property
    def loss(self) -> float | None: ...
    @property
    def first_loss(self) -> float | None: ...
    @property
    def samples_per_s(self) -> float | None: ...
    @property
    def first_step(self) -> int | None: ...
    @property
    def first_step_at(self) -> float | None: ...
    @property
    def last_report_at(self) -> float | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def layout_seen(self) -> str | None: ...
    @property
    def billed_micro_usd(self) -> int | None: ...
    @property
    def run_from_micro_usd(self) -> int | None: ...


class ClusterRecord(Protocol):
    """The fields of a cluster row (store.Cluster) that a job's view reads."""

    @property
    def name(self) -> str: ...
    @property
    def gpu(self) -> str: ...
    @property
    def price_book(self) -> str | None: ...
    @property
    def usd_per_hour(self) -> float: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def stopped_at(self) -> float | None: ...
    @property
    def banked_usd(self) -> float | None: ...
    @property
    def rate_since(self) -> float | None: ...
    @property
    def simulated(self) -> bool | None: ...


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
    projected_cost_usd: float | None  # so far plus the rate over the ETA; final once ended
    usd_per_hour: float
    price_book: str | None
    reason: str | None
    exit_code: int | None
    layout: str | None = None  # strategy, mesh, precision, framework, and who applied it
    layout_seen: str | None = None  # "applied" or "own:KIND" (layout_use), None before a step
    started_at: float | None = None  # UNIX seconds: the workers started / the job ended
    ended_at: float | None = None
    # rank -> {"params_bytes", "grads_bytes", "optimizer_bytes", ["cuda_max_allocated_bytes"]}
    model_state: dict[int, dict[str, float]] = field(default_factory=dict)
    # seconds since rank 0's newest report, once past `quiet_limit_s` while running; else None
    no_report_s: float | None = None
    # chart metric -> why this script does not produce it (`measured.not_measured`)
    not_measured: dict[str, str] = field(default_factory=dict)
    image: str | None = None  # the container image its launcher ran in (docs/images.md)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def seconds_per_step(job: JobRecord) -> float | None:
    """Mean step time between rank 0's first report and its latest one (whatever step the run
    started at, e.g. a resumed run, and however often the script reports)."""
    first = job.first_step if job.first_step is not None else 1
    if job.step is None or job.step <= first or job.first_step_at is None \
            or job.last_report_at is None:
        return None
    return (job.last_report_at - job.first_step_at) / (job.step - first)



LayoutWords = Callable[[str, int], str | None]  # (spec_json, world_size) -> words


def layout_of(job: JobRecord, words: LayoutWords | None = None) -> str | None:
    """The job's strategy, mesh and precision in words, from its stored spec (through `words`
    when given: a reader that can tell them without validating the spec), and whether gpufleet
    applied it or the script ran as written (`layout_use`)."""
    requested = (words or requested_layout)(job.spec_json, job.world_size)
    return layout_use.describe(requested, job.layout_seen, job.spec_json,
                               ended=job.status not in JOB_ACTIVE)


@functools.lru_cache(maxsize=64)
def requested_layout(spec_json: str, world_size: int) -> str | None:
    # Cached: the live view asks four times a second, and the answer never changes for a job.
    from gpufleet.spec import JobSpec  # Pydantic: imported only when a spec is validated

    try:
        spec = JobSpec.model_validate(json.loads(spec_json))
        return f"{spec.layout(world_size).describe}, {spec.framework}"
    except (ValueError, TypeError):  # a spec stored by an older version, or an impossible one
        return None


def quiet_limit_s(seconds_per_step_s: float | None) -> float:
    """How long rank 0 may go without a report before `status` says so: `STALE_STEPS` step
    times, but never under `STALE_FLOOR_S`, which is far above the cadence of any report
    (the bootstrap sends up to 4 a second, a script's `train.report` usually every few
    steps) and well under the 5-minute default hang timeout that ends such a job."""
    steps = STALE_STEPS * seconds_per_step_s if seconds_per_step_s is not None else 0.0
    return max(STALE_FLOOR_S, steps)


def no_report_s(job: JobRecord, now: float, run_started_at: float | None = None) -> float | None:
    """Seconds since rank 0's newest report, when that is past `quiet_limit_s` and the job is
    running; None otherwise. `run_started_at`: the current run's start; a run that has not
    reported yet is starting up (the hang check's start-up grace covers it), not silent."""
    last = job.last_report_at
    if job.status != JobStatus.RUNNING or last is None:
        return None
    if run_started_at is not None and last < run_started_at:
        return None
    quiet = now - last
    return quiet if quiet > quiet_limit_s(seconds_per_step(job)) else None


def job_view(job: JobRecord, cluster: ClusterRecord, now: float,
             model_state: dict[int, dict[str, float]] | None = None,
             layout_words: LayoutWords | None = None,
             run_started_at: float | None = None) -> JobView:
    """`run_started_at`: the current run's start, when the caller knows it (`no_report_s`)."""
    start = job.started_at or job.created_at
    end = job.ended_at or now
    eta = None
    sps = seconds_per_step(job)
    active = job.status in JOB_ACTIVE
    if active and sps is not None and job.total_steps:
        eta = max(0, job.total_steps - (job.step or 0)) * sps
    so_far = billing.job_cost_usd(job, cluster, now)
    projected = so_far if not active else \
        cost.projected_usd(so_far, cluster.usd_per_hour, eta)
    return JobView(
        job=job.name, cluster=cluster.name, gpu=cluster.gpu, status=job.status,
        world_size=job.world_size, step=job.step, total_steps=job.total_steps, loss=job.loss,
        first_loss=job.first_loss, samples=job.samples, samples_per_s=job.samples_per_s,
        elapsed_s=max(0.0, end - start), eta_s=eta,
        cost_usd=so_far, projected_cost_usd=projected,
        usd_per_hour=cluster.usd_per_hour,
        price_book="simulated, not billed" if cluster.simulated else cluster.price_book,
        reason=job.reason, exit_code=job.exit_code, layout=layout_of(job, layout_words),
        layout_seen=job.layout_seen,
        started_at=job.started_at, ended_at=job.ended_at,
        model_state=dict(sorted((model_state or {}).items())),
        no_report_s=no_report_s(job, now, run_started_at),
        not_measured=measured.not_measured(job.spec_json, job.world_size, job.layout_seen,
                                           job.step, job.first_step, job.samples),
        image=image_of(job.spec_json),
    )


def image_of(spec_json: str) -> str | None:
    """The image the job runs in, as its spec was stored (with the cluster's or pool's
    default written in at submission: lifecycle/images.py)."""
    try:
        image = json.loads(spec_json).get("image")
    except (ValueError, TypeError, AttributeError):  # no spec, or not a mapping
        return None
    return image if isinstance(image, str) else None
