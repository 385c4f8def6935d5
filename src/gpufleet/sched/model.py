"""What the scheduler reads and what it answers, as plain frozen data.

Devices are counted per (pool, GPU type): that is what quotas are written in and what the
estimates use. Whether a job's gang really fits now (topology, whole nodes for a multi-node
job) is the allocator's question, asked through `Fits`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

Resource = tuple[str, str]  # (pool, GPU type): "local", "cpu"


class Wait(StrEnum):
    """Why a queued job has not started: each has one line of text with the numbers."""

    DEVICES = "devices"  # its gang is not free yet
    BEHIND = "behind"  # it could fit, but would delay the job ahead (no backfill)
    CLUSTER = "cluster"  # the cluster it names runs another job
    QUOTA = "quota"  # its team holds its GPU quota
    BUDGET = "budget"  # its team's monthly budget is spent, or would be by this job
    HELD = "held"  # its owner (or an admin) held it: it keeps its place but does not start
    AFTER = "after"  # the job it runs after (--after, Slurm's afterok) has not succeeded yet


@dataclass(frozen=True)
class Waiting:
    """A queued job, as the scheduler needs to see it."""

    name: str
    user: str
    team: str | None
    priority: int
    submitted_at: float
    resource: Resource
    count: int  # devices of its gang (a job on an existing cluster: that cluster's)
    cluster: str | None = None  # an existing cluster it runs on, else one is made for it
    duration_s: float | None = None  # its time limit (or an estimate); None: unknown
    usd_per_hour: float = 0.0  # what it will be billed per hour
    after: str | None = None  # a job that must succeed before this one may start
    held: bool = False  # held (gpufleet hold) until released


@dataclass(frozen=True)
class Running:
    """A job holding devices now (or a cluster that will be free when its job ends)."""

    name: str
    user: str
    team: str | None
    resource: Resource
    count: int
    started_at: float
    ends_by: float | None  # start + time limit; None: no limit, so no promise
    cluster: str | None = None  # the existing cluster it runs on, which keeps its devices
    # when the job ends (None: a cluster made for the job, whose devices end with it)
    idle: bool = False  # not a job: a launched cluster without one, holding its devices until
    # it is stopped


@dataclass(frozen=True)
class Limits:
    """A team's caps: devices of a type at once, and dollars left this month."""

    quotas: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (team, gpu) -> max
    budget_left: Mapping[str, float] = field(default_factory=dict)  # team -> USD left
    budget_of: Mapping[str, float] = field(default_factory=dict)  # team -> monthly USD


@dataclass(frozen=True)
class Start:
    name: str
    backfilled: bool = False  # started ahead of a job that waits, without delaying it


@dataclass(frozen=True)
class Held:
    name: str
    wait: Wait
    text: str  # one line, with the numbers
    position: int  # 1 = next to start among the waiting jobs
    est_start: float | None  # None: it cannot be told; `unknown` says why
    unknown: str | None = None  # why there is no estimate, in words ("held", "after j1",
    # "unknown (a running job has no --time-limit)"); None when there is one


@dataclass(frozen=True)
class Cancel:
    """A queued job that can never start (the job it runs after failed): it leaves the queue."""

    name: str
    text: str


@dataclass(frozen=True)
class Plan:
    starts: tuple[Start, ...]
    held: tuple[Held, ...]
    cancels: tuple[Cancel, ...] = ()

    def held_of(self, name: str) -> Held | None:
        return next((h for h in self.held if h.name == name), None)


Fits = Callable[[Waiting], bool]
"""Would this job's whole gang fit now, given what was already started in this plan? Answering
yes takes the devices (the caller's allocator keeps them until the plan is carried out)."""
