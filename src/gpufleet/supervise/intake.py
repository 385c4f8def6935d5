"""What arrives on the report socket: progress reports, Checkpointer notes, node agents' device
samples; turned into job progress and metric rows (for the store) and machine events.

The port is open to any local process, so a datagram counts only with a valid signature under
the job's key (`reportauth`; the rest are counted in `dropped` and told once in a while, see
`rejected.py`), and every field is typed here: a string where a number belongs raises
ValueError and drops the datagram, rather than reaching the store or the page.
"""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from gpufleet import layout_use
from gpufleet.reportauth import Rejection, Verifier
from gpufleet.store import Cluster, Job, Metric, Store
from gpufleet.supervise import rejected
from gpufleet.supervise.events import Event, RecordEvent, Reported, WorkerNote
from gpufleet.supervise.goodput import Mark
from gpufleet.supervise.notes import note_of, opt_number
from gpufleet.supervise.progress import Report, Throughput
from gpufleet.telemetry import wire
from gpufleet.telemetry.recent import Recent
from gpufleet.telemetry.schema import DEVICE_METRICS, JOB_RANK, MODEL_STATE_METRICS, STEP_METRIC

MARKS_KEPT_S = 120.0  # rank 0's reports kept for judging a resize (goodput windows are <= 30 s)
MARKS_KEPT_MIN = 16  # and at least this many, for slow steps
_PROGRESS = ("step", "total_steps", "samples", "loss", "first_loss", "samples_per_s",
             "first_step", "first_step_at", "last_report_at", "layout_seen")


class Intake:
    """The job's progress as reports tell it, and the metric rows waiting for the store.

    `pending` is shared with the device sampler thread, hence the lock.
    """

    def __init__(self, job: Job, cluster: Cluster, key: str):
        self.job, self.cluster = job, cluster
        self.verifier = Verifier(key)
        self.dropped = rejected.Dropped()
        self.throughput = Throughput()
        self.marks: deque[Mark] = deque()  # rank 0's reports in this run (goodput.Mark)
        self.pending: list[Metric] = []
        self.lock = threading.Lock()
        self.recent = Recent()
        self.model_state: dict[int, dict[str, float]] = {}  # rank -> latest model-state bytes
        self.progress_dirty = False
        self.samples_before = 0
        self.worker_pids: dict[int, int] = {}
        self.nodes: dict[int, str] = {}  # rank -> the node its reports came from (wire.node_of)
        # a rank's bootstrap armed (or a report came): this job reports its steps, so its
        # silence means something (the stall rules judge only such jobs)
        self.reports_expected = False
        self.reported_loss = False  # a report carried the loss: log lines are not read for it
        self.sdk_reports = False  # a train.report arrived: the bootstrap's counts are not steps
        self.requested_layout: str | None = None  # the spec's layout in words, for the note

    def new_run(self) -> None:
        """Reports count from 0 in each run of the workers."""
        self.worker_pids = {}
        self.samples_before = self.job.samples or 0
        self.throughput = Throughput()
        self.marks = deque()
        self.job.first_step = self.job.first_step_at = None

    def datagram(self, data: bytes, pid_ok: Callable[[int], bool]) -> list[Event | RecordEvent]:
        """One datagram in; the machine events and job events it makes. One without a valid
        signature is counted and dropped; a malformed one is dropped: not worth failing a job
        over. `pid_ok`: whether a reported pid is one of this job's processes."""
        payload = self.verifier.open(data)
        if isinstance(payload, Rejection):
            self.dropped = rejected.count(self.dropped, payload)
            return []
        try:
            rec = json.loads(payload)
            if rec.get(wire.EVENT) == wire.BOOTSTRAP:
                self.reports_expected = True
            if rec.get(wire.EVENT) == wire.LAYOUT:
                return self._layout(rec)
            if wire.EVENT in rec:
                note, record = note_of(rec, self.job.total_steps)
                self._learn_pid(note.rank, rec.get("pid"), pid_ok)
                return [note] if record is None else [note, record]
            if wire.DEVICE_SAMPLES in rec:
                self._samples(rec)
                return []
            report = wire.read_progress(rec)
            if report.source == wire.BOOTSTRAP and self.sdk_reports:
                # a script that reports through the SDK on some ranks only (rank 0): the other
                # ranks' optimizer counts would be compared with its steps; a sign of life only
                return [WorkerNote("alive", report.rank)]
            return [self._report(report, pid_ok)]
        except (ValueError, TypeError, KeyError, OverflowError):
            return []

    def _layout(self, rec: dict[str, Any]) -> list[Event | RecordEvent]:
        """The first step's note of who set the layout up: recorded once per job (every rank
        sends one; a restart's are the same script)."""
        applied = bool(rec.get("applied"))
        own = str(rec.get("own"))[:16] if rec.get("own") is not None else None
        seen = layout_use.stored(applied, own)
        note = WorkerNote("layout", int(rec["rank"]))
        if self.job.layout_seen == seen:
            return [note]
        with self.lock:
            self.job.layout_seen = seen
            self.progress_dirty = True
        layout = str(rec["layout"])[:200] if rec.get("layout") is not None else None
        world = opt_number(int, rec.get("world")) or self.job.world_size
        text = layout_use.note(applied, own, layout, world, self.requested_layout,
                               self.job.spec_json)
        return [note, RecordEvent("layout", text)]

    def log_loss(self, t: float, value: float) -> None:
        """A loss read from rank 0's log line (a script that does not report it): the job's
        loss and a `loss` metric, like a reported one. Called from the log reader thread."""
        if self.reported_loss:
            return
        self.recent.add("loss", 0, t, value)
        node = self.nodes.get(0, wire.LOCAL)  # the log line is rank 0's
        with self.lock:
            j = self.job
            j.loss = value
            if j.first_loss is None:
                j.first_loss = value
            self.progress_dirty = True
            if math.isfinite(value):
                self.pending.append(Metric(time=t, cluster=self.cluster.name, job=j.name,
                                           node=node, rank=0, name="loss", value=value))

    def dropped_note(self, now: float, final: bool = False) -> RecordEvent | None:
        """The job event about dropped datagrams, when one is due (see `rejected.note`)."""
        self.dropped, record = rejected.note(self.dropped, now, final)
        return record

    def add_samples(self, rows: list[Metric]) -> None:
        with self.lock:
            self.pending += rows

    def _samples(self, rec: dict[str, Any]) -> None:
        """Device samples from a node's agent (a Ray pool), keyed by the device's position in
        the cluster and labelled node/device."""
        node = wire.node_of(rec)
        t = float(rec[wire.T])
        rows = []
        for key, device, name, value in rec[wire.DEVICE_SAMPLES]:
            if name not in DEVICE_METRICS or not isinstance(value, int | float):
                continue
            self.recent.add(name, int(key), t, float(value))
            if math.isfinite(value):
                rows.append(Metric(time=t, cluster=self.cluster.name, job=self.job.name,
                                   node=node, rank=int(key), device=f"{node}/{str(device)[:24]}",
                                   name=name, value=float(value)))
        self.add_samples(rows)

    def _learn_pid(self, rank: int, pid: Any, pid_ok: Callable[[int], bool]) -> None:
        """The rank's process, from any of its reports or notes: the first note comes before
        the first step (the bootstrap's, a Ray Train worker's as it starts), and a Ray worker
        has no RANK in its environment for the sampler to find it by."""
        if isinstance(pid, int) and not isinstance(pid, bool) and \
                self.worker_pids.get(rank) != pid and pid_ok(pid):
            self.worker_pids[rank] = pid

    def _report(self, p: wire.Progress, pid_ok: Callable[[int], bool]) -> Reported:
        r = Report(t=p.t, rank=p.rank, step=p.step, samples=p.samples, loss=p.loss,
                   total_steps=p.total_steps, samples_total=p.samples_total)
        self._learn_pid(r.rank, p.pid, pid_ok)
        self.nodes[r.rank] = p.node
        self.reports_expected = True
        self.sdk_reports = self.sdk_reports or p.source != wire.BOOTSTRAP
        if r.loss is not None:
            self.reported_loss = True
        for key, value in p.metrics.items():
            if key in MODEL_STATE_METRICS:
                self.model_state.setdefault(r.rank, {})[key] = value
            self.recent.add(key, r.rank, r.t, value)  # NaN too: a diagnosis
        # SQL has no NaN: such a sample is lost, not the job. The step too, at the same time
        # and rank, so a chart can put any sample on a step axis.
        stored = {**p.finite_metrics, STEP_METRIC: float(r.step)}
        rows = [Metric(time=r.t, cluster=self.cluster.name, job=self.job.name, node=p.node,
                       rank=r.rank, name=key, value=value) for key, value in stored.items()]
        self.add_samples(rows)
        if r.rank == 0:
            self._progress(r)
        return Reported(r.rank, r.step)

    def _progress(self, r: Report) -> None:
        with self.lock:  # the log reader thread writes the loss
            self._progress_locked(r)

    def _progress_locked(self, r: Report) -> None:
        j = self.job
        self.throughput.add(r)
        tp = self.throughput
        self.marks.append(Mark(r.t, r.step, tp.total_samples if tp.saw_samples else None))
        while len(self.marks) > MARKS_KEPT_MIN and r.t - self.marks[0].t > MARKS_KEPT_S:
            self.marks.popleft()
        if j.first_step_at is None:
            j.first_step_at, j.first_step = r.t, r.step
        j.step, j.last_report_at = r.step, r.t
        j.samples = self.samples_before + self.throughput.total_samples
        if r.total_steps is not None:
            j.total_steps = r.total_steps
        elif j.total_steps is not None and r.step > j.total_steps:
            # a total read from the script's arguments (nanoGPT runs max_iters + 1 steps): the
            # steps that ran are the truth, never "31/30"
            j.total_steps = r.step
        if r.loss is not None:
            j.loss = r.loss
            if j.first_loss is None:
                j.first_loss = r.loss
        j.samples_per_s = self.throughput.samples_per_s()
        self.progress_dirty = True

    def progress_marks(self) -> tuple[Mark, ...]:
        with self.lock:
            return tuple(self.marks)

    def flush(self, store: Store) -> None:
        """Progress onto the job's row and the waiting metric rows, in one write."""
        with self.lock:
            rows, self.pending = self.pending, []
            dirty, self.progress_dirty = self.progress_dirty, False
            values = {k: getattr(self.job, k) for k in _PROGRESS}
        if not dirty and not rows:
            return
        j = self.job
        if dirty and j.samples_per_s is not None and j.last_report_at is not None:
            rows.append(Metric(time=j.last_report_at, cluster=self.cluster.name, job=j.name,
                               node="local", rank=JOB_RANK, name="job_samples_per_second",
                               value=j.samples_per_s))
        with store.session() as s:
            row = s.get(Job, j.id)
            if row is not None and dirty:
                for k, v in values.items():
                    setattr(row, k, v)
            s.add_all(rows)
