"""The supervisor machine's state, and how a new run of the workers begins (shared by a restart,
a heal and a resize). Pure, like the rest of the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from gpufleet.status import JobStatus
from gpufleet.supervise import elastic, goodput, outcome, restarts
from gpufleet.supervise.events import Action, Heal, StartWorkers, Transition

Phase = Literal["idle", "running", "backoff", "healing", "reshaping", "done"]


@dataclass(frozen=True)
class Config:
    """What the machine knows of the job that never changes while it runs."""

    cluster_name: str
    max_restarts: int
    hang_timeout_s: float
    policy: elastic.Policy | None = None  # an elastic job's
    allowed: tuple[int, ...] = ()  # the sizes an elastic job may take
    heals: bool = False  # the engine can lose nodes: heal before every run after the first
    durable: bool = False  # checkpoints are copied to --checkpoint-to
    time_limit_s: float | None = None  # from the first start, over every restart (--time-limit)
    usd_per_device_hour: float = 0.0  # the cluster's rate per device: goodput per dollar


@dataclass(frozen=True)
class State:
    config: Config
    workers: int
    step: int | None = None  # the latest step rank 0 reported (over all runs)
    phase: Phase = "idle"
    runs: int = 0
    started_at: float = 0.0  # of this run
    training_since: float | None = None  # this run's first report
    last_seen: dict[int, tuple[float, int]] = field(default_factory=dict)  # rank -> (time, step)
    ever_reported: bool = False
    checkpoint_step: int | None = None
    copied_step: int | None = None  # the newest checkpoint copied to --checkpoint-to
    has_checkpointer: bool = False
    exited_for_resize: bool = False
    exit_asked: bool = False  # this run's workers were asked to save and exit (a resize)
    failures: tuple[restarts.Failure, ...] = ()
    final_failure: str | None = None
    stop_reason: str | None = None
    interrupted: bool = False
    error: str | None = None
    exit_code: int | None = None
    control_seq: int = 0
    resize_target: int | None = None
    resize_deadline: float | None = None
    reshaping: tuple[int, int] | None = None  # (before, target) while the reservation changes
    last_scale_note: str = ""
    last_policy: float = 0.0
    first_started_at: float | None = None  # the first run's start, for the time limit
    ran_at: int = 0  # the largest size the job has run at (an elastic job grows back to it)
    trial: goodput.Trial | None = None  # a resize waiting for its goodput verdict
    judged: tuple[goodput.Judgement, ...] = ()  # every verdict, oldest first
    holds: goodput.Holds = field(default_factory=goodput.Holds)  # directions held off

    @property
    def ending(self) -> outcome.Ending:
        return outcome.Ending(self.exit_code, self.error, self.final_failure, self.stop_reason,
                              self.exited_for_resize)

    @property
    def hang_timeout_s(self) -> float:
        """Doubled while the workers save for a resize."""
        return self.config.hang_timeout_s * (2 if self.resize_deadline is not None else 1)


Result = tuple[State, list[Action]]


def initial(config: Config, workers: int, step: int | None = None,
            copied_step: int | None = None) -> State:
    """A job's machine before its first run; `step` and `copied_step` carry what its earlier
    runs reached (a resumed job's last step and durable copy)."""
    return State(config=config, workers=workers, step=step, copied_step=copied_step)


def start_run(state: State, now: float) -> Result:
    """A new run of the workers at the current size."""
    runs = state.runs + 1
    s = replace(state, phase="running", runs=runs, started_at=now, training_since=None,
                last_seen={}, exited_for_resize=False, exit_asked=False, last_policy=0.0,
                ran_at=max(state.ran_at, state.workers))
    actions: list[Action] = [StartWorkers(s.workers, runs)]
    if runs > 1:
        actions.append(Transition(JobStatus.RUNNING, f"{s.workers} worker(s) on "
                                  f"{s.config.cluster_name} (run {runs})",
                                  {"world_size": s.workers}))
    return s, actions


def next_run(state: State, now: float) -> Result:
    if state.config.heals:
        return replace(state, phase="healing"), [Heal()]
    return start_run(state, now)
