"""What the supervisor's state machine hears (events) and what it asks for (actions).

Both are frozen dataclasses holding plain values, so a test writes the events a run would
produce and reads the actions back, and the supervisor process is left with translating: a
backend poll, a UDP report, a signal, the clock or the control file into an event; an action
into a store write, a process start or kill, a line on the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufleet.status import JobStatus
from gpufleet.supervise.goodput import Mark

# -- events ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Begin:
    """The job is claimed (no `gpufleet stop` got there first): start the first run."""


@dataclass(frozen=True)
class WorkersStarted:
    """The backend started this run's process tree (the start-up clock runs from here)."""


@dataclass(frozen=True)
class Reported:
    """A progress report from a rank: a sign of life, and (rank 0) the job's step."""

    rank: int
    step: int


@dataclass(frozen=True)
class WorkerNote:
    """A lifecycle note from the Checkpointer: checkpointer, checkpoint, resumed,
    exit_for_resize, or a copy/skip note (a sign of life only)."""

    kind: str
    rank: int
    step: int | None = None


@dataclass(frozen=True)
class Tick:
    """Time passed while the workers run. `util`: (time, mean device utilization) since
    training started; `stopped`: rank -> whether its process is stopped, filled in only when
    `machine.needs_process_states` says so; `free`: devices the job could grow by, filled in
    only when `machine.needs_free_devices` says so; `progress`: rank 0's reports in this run,
    for judging a resize by goodput (filled in, like `util`, when an elastic decision is due)."""

    util: tuple[tuple[float, float], ...] = ()
    stopped: Mapping[int, bool] = field(default_factory=dict)
    free: int | None = None
    progress: tuple[Mark, ...] = ()


@dataclass(frozen=True)
class ResizeAcknowledged:
    """The workers' file says they exited for the resize request numbered `seq`."""

    seq: int


@dataclass(frozen=True)
class WorkersExited:
    """The worker group's process tree exited; for a failure, the rank that caused it, its
    code and error, and the last lines. `node_lost`: the engine lost a node (its peers'
    errors are knock-on effects)."""

    code: int | None
    rank: int | None = None
    rank_code: int | None = None
    error: str | None = None
    last_lines: str = ""
    node_lost: bool = False


@dataclass(frozen=True)
class StopRequested:
    reason: str


@dataclass(frozen=True)
class BackoffOver:
    """The pause after a failure is over: start again."""


@dataclass(frozen=True)
class Healed:
    """Lost nodes were replaced (or the cluster goes on without them): the new size, and one
    line per change."""

    workers: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resized:
    """The reservation changed for a resize: the size it has now; `blocked`, why the devices
    could not be had (the job stays at its old size)."""

    workers: int
    blocked: str | None = None


@dataclass(frozen=True)
class SupervisorFailed:
    error: str  # "supervisor error: TypeName: message"


@dataclass(frozen=True)
class Interrupted:
    """Ctrl-C in the foreground."""


Event = (Begin | WorkersStarted | Reported | WorkerNote | Tick | ResizeAcknowledged
         | WorkersExited | StopRequested | BackoffOver | Healed | Resized | SupervisorFailed
         | Interrupted)

# -- actions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartWorkers:
    """Prepare and start run number `run` at `workers` workers (then send WorkersStarted)."""

    workers: int
    run: int


@dataclass(frozen=True)
class EndWorkers:
    """End this run's process tree: SIGTERM, then SIGKILL after `grace_s` (0 for a hang: a
    stopped process only dies of SIGKILL)."""

    grace_s: float


@dataclass(frozen=True)
class Transition:
    """Move the job to `status` with `reason` (and set `fields` on its row)."""

    status: JobStatus
    reason: str
    fields: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordEvent:
    kind: str
    text: str


@dataclass(frozen=True)
class RequestWorkers:
    """Write the control file: `action` is save_exit (save a checkpoint and exit to be
    resized) or none (a request withdrawn); `seq` numbers the request."""

    action: str
    seq: int


@dataclass(frozen=True)
class Resize:
    """Change a job-owned cluster's reservation from `before` to `target` devices, then send
    Resized with the size it got."""

    before: int
    target: int


@dataclass(frozen=True)
class Heal:
    """Replace the nodes the last run lost (the backend says which), then send Healed."""


@dataclass(frozen=True)
class Wait:
    """Back off `seconds` (still answering a stop), then send BackoffOver."""

    seconds: float


@dataclass(frozen=True)
class Say:
    """A line for the terminal of a foreground run (prefixed 'gpufleet: ')."""

    text: str


@dataclass(frozen=True)
class NewLogRun:
    """Mark a new run of the workers in the logs (and forget the old run's tails)."""

    note: str


@dataclass(frozen=True)
class Finish:
    """The job is over: end the workers, record the final status (see `outcome.final`)."""

    code: int | None


Action = (StartWorkers | EndWorkers | Transition | RecordEvent | RequestWorkers | Resize | Heal
          | Wait | Say | NewLogRun | Finish)
