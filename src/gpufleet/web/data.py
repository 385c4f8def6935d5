"""What the dashboard's API and `/metrics` read: the views the CLI shows too (`gpufleet.views`),
so the page, the terminal and Prometheus agree to the cent.

The one thing added here is the step of every chart sample, for the page's step axis. Each
rank's report is stored as its samples plus a `step` sample at the same time and rank
(`supervise/intake.py`), so a rank's sample takes the step that rank had reported by then; a
device or whole-job sample takes rank 0's, the job's step at that moment. A sample from before
the first report of its run (a run: one start of the workers, `supervise.timeline`) has no step
(None) and is left off a step axis rather than guessed: the previous run's last step is not
where a restarted run's first samples belong.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select

from gpufleet.lifecycle import jobs
from gpufleet.store import Metric, Store
from gpufleet.supervise import timeline
from gpufleet.telemetry.schema import STEP_METRIC
from gpufleet.views import all_clusters, cluster_dict, job_detail, views
from gpufleet.views import job_series as _job_series

__all__ = ["all_clusters", "attach_steps", "cluster_dict", "job_detail", "job_series",
           "rank_of", "run_start", "step_at", "views"]

Points = list[tuple[float, float]]
StepPoints = list[tuple[float, float, float | None]]
# a sample stored as the mean of a bucket (store/retention.py) has a mean time: the step
# sample merged with it has the same mean, give or take float rounding
_SAME_TIME_S = 1e-6
_LOOK_BACK = 4096  # step samples read back from `since` for each rank's last report


def rank_of(label: str) -> int:
    """The rank whose steps a series label is placed by: its own for "rank N", else rank 0."""
    if label.startswith("rank "):
        try:
            return int(label[5:])
        except ValueError:
            return 0
    return 0


def step_at(steps: Points, t: float, since: float = float("-inf")) -> float | None:
    """The step of the last report at or before `t` in `steps` ([(time, step)], oldest first);
    None before the first one, or when that report came before `since` (its run's start)."""
    i = bisect.bisect_right(steps, (t + _SAME_TIME_S, float("inf")))
    return steps[i - 1][1] if i and steps[i - 1][0] >= since - _SAME_TIME_S else None


def attach_steps(series: Mapping[str, Mapping[str, Points]], steps: Mapping[int, Points],
                 starts: Sequence[float] = ()) -> dict[str, dict[str, StepPoints]]:
    """Every (time, value) of `series` (name -> label -> points) as (time, value, step), with
    `steps` rank -> [(time, step)] oldest first and `starts` the runs' start times, oldest
    first. The step samples themselves are left out: they are the axis, not a chart."""
    out: dict[str, dict[str, StepPoints]] = {}
    for name, by_label in series.items():
        if name == STEP_METRIC:
            continue
        out[name] = {}
        for label, points in by_label.items():
            own = steps.get(rank_of(label), [])
            out[name][label] = [(t, v, step_at(own, t, run_start(starts, t)))
                                for t, v in points]
    return out


def run_start(starts: Sequence[float], t: float) -> float:
    """The start of the run `t` falls in (-inf before the first)."""
    i = bisect.bisect_right(starts, t)
    return starts[i - 1] if i else float("-inf")


def steps_since(store: Store, job: str, since: float) -> dict[int, Points]:
    """rank -> [(time, step)] of the job's reports after `since`, each rank's list led by its
    last report at or before `since` (what a device sample just after `since` is placed by).
    Not thinned: every sample has to find its own report. The look back walks the newest
    `_LOOK_BACK` step samples, not the job's whole history, on every poll: a rank's own samples
    always come with their report's step, so only a long-silent rank's lead is missed there."""
    with store.read() as s:
        before = s.execute(select(Metric.rank, Metric.time, Metric.value).where(
            Metric.job == job, Metric.name == STEP_METRIC, Metric.time <= since)
            .order_by(Metric.time.desc()).limit(_LOOK_BACK)).all() if since > 0 else []
        after = s.execute(select(Metric.rank, Metric.time, Metric.value).where(
            Metric.job == job, Metric.name == STEP_METRIC, Metric.time > since)
            .order_by(Metric.time)).all()
    out: dict[int, Points] = {}
    for rank, t, value in before:  # newest first: the first seen of each rank is its last
        out.setdefault(rank, [(t, value)])
    for rank, t, value in after:
        out.setdefault(rank, []).append((t, value))
    return out


def job_series(store: Store, name: str, since: float, names: list[str] | None,
               now: float) -> dict[str, Any]:
    """The job's chart series after `since` (`gpufleet.views.job_series`), each point as
    [time, value, step]."""
    found = _job_series(store, name, since, names, now)
    starts = [r.start for r in timeline.runs(
        (e.time, e.kind, e.reason) for e in jobs.events(store, jobs.get(store, name).id))]
    found["series"] = attach_steps(found["series"], steps_since(store, name, since), starts)
    return found
