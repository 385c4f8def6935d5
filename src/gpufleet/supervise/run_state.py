"""What one supervised job holds while it runs, with one owner.

The machine (`machine.py`) decides; its state is a frozen value the supervisor steps. Around it
is the state of the I/O: the job's and its cluster's rows as they stand now, the worker group
running now (its handle, the thread reading its output), the log sink and the report socket,
when a backoff ends, and the events that carrying out an action produced. That lives here, in
one `RunState` per supervisor, and changes only through the methods below, each named for what
happened. The supervisor's helpers are handed this object (or a narrow callable), never the
supervisor: so `supervisor` -> `actions` -> `telemetry` -> `run_state` import one way.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufleet.backends.base import Backend, Handle
from gpufleet.spec import JobSpec
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Job, Store
from gpufleet.supervise import events as ev
from gpufleet.supervise.elastic import Policy
from gpufleet.supervise.intake import Intake
from gpufleet.supervise.logs import LogSink
from gpufleet.supervise.output import OutputLines
from gpufleet.telemetry.recent import Recent


@dataclass(eq=False)
class RunState:
    """One supervised job's I/O state. The first fields are fixed for the supervisor's life;
    the rest change as the job goes, through the methods."""

    store: Store
    backend: Backend
    spec: JobSpec
    policy: Policy | None  # an elastic job's; None for a fixed size
    report_key: str  # signs the workers' reports; reaches them through their environment only
    intake: Intake  # the workers' reports and output, turned into events and metric rows
    lines: OutputLines
    job: Job  # as last recorded (a transition's fields applied here as in the store)
    cluster: Cluster  # as last recorded: a heal, a resize or a new allocation replaces it
    handle: Handle | None = None  # the running worker group
    reader: threading.Thread | None = None  # copies its output into the logs
    sink: LogSink | None = None
    sock: socket.socket | None = None
    backoff_until: float = 0.0  # time.monotonic() at which a backoff ends
    # the running launcher's command and environment, and where it takes a restart in place
    # (launch/warm_restart.py); `parked`: the exit code it said its workers ended with, while
    # it waits for the supervisor (set by the output reader's thread)
    launched: tuple[list[str], dict[str, str]] | None = None
    restart_file: str | None = None
    parked: int | None = None
    wake: tuple[int, int] | None = None  # a pipe: the reader wakes the loop through it
    follow_ups: deque[ev.Event] = field(default_factory=deque)  # events actions' I/O produced

    @property
    def recent(self) -> Recent:
        """The last minutes of samples in memory, what diagnosis and elastic decisions read."""
        return self.intake.recent

    def opened(self, sink: LogSink, sock: socket.socket) -> None:
        """The job's logs and report socket are open."""
        self.sink, self.sock, self.wake = sink, sock, os.pipe()

    def closed(self) -> None:
        """The report socket and the wake pipe are closed (the logs close with the outcome)."""
        if self.sock is not None:
            self.sock.close()
        if self.wake is not None:
            for fd in self.wake:
                os.close(fd)
            self.wake = None

    def workers_started(self, handle: Handle, reader: threading.Thread,
                        launched: tuple[list[str], dict[str, str]],
                        restart_file: str | None) -> None:
        self.handle, self.reader = handle, reader
        self.launched, self.restart_file, self.parked = launched, restart_file, None

    def launcher_parked(self, code: int) -> None:
        """The launcher's workers ended with `code`; it waits (the output reader's thread)."""
        self.parked = code
        if self.wake is not None:
            os.write(self.wake[1], b"p")

    def restarted_in_place(self) -> None:
        self.parked = None

    def workers_ended(self) -> None:
        self.handle, self.reader = None, None
        self.launched, self.restart_file, self.parked = None, None, None

    def back_off_until(self, monotonic_s: float) -> None:
        self.backoff_until = monotonic_s

    def cluster_changed(self, cluster: Cluster) -> None:
        """The cluster as the store has it after a heal, a resize, a new allocation, a stop."""
        self.cluster = cluster

    def job_recorded(self, job: Job) -> None:
        """The job as the store has it now."""
        self.job = job

    def job_moved(self, status: JobStatus, fields: Mapping[str, object]) -> None:
        """A transition the store recorded, applied to the row held here."""
        self.job.status = status
        for key, value in fields.items():
            setattr(self.job, key, value)

    def then(self, event: ev.Event) -> None:
        """An event an action's I/O produced: the machine steps on it next."""
        self.follow_ups.append(event)
