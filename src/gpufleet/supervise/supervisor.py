"""One supervisor per job: start torchrun, follow its output and reports, record the outcome.

It runs inside `gpufleet run` (foreground) or as its own detached process (`--detach`). Either
way the store is the only thing other commands read, so `status`, `list` and `logs` work the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from gpufleet import clusters
from gpufleet.backends.local import Handle, LocalBackend, kill
from gpufleet.launch import frameworks
from gpufleet.launch.torchrun import JobContext, merge_env
from gpufleet.store import Cluster, Job, Metric, Store
from gpufleet.supervise import jobs
from gpufleet.supervise.logs import LogSink, failed_rank, last_exception
from gpufleet.supervise.progress import Report, Throughput
from gpufleet.supervise.telemetry import TelemetryState
from gpufleet.supervise.view import MODEL_STATE_METRICS, JobView, job_view
from gpufleet.telemetry.recent import Recent
from gpufleet.telemetry.schema import JOB_RANK

FLUSH_EVERY_S = 0.25  # reports reach the store (and the dashboard) at most this late
_NOT_METRICS = ("t", "rank", "step", "total_steps", "samples_total", "pid")
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Orphaned workers (their torchrun died first) re-parent to us, so we can still end them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, store: Store, job: Job, cluster: Cluster, backend: LocalBackend,
                 on_tick: Callable[[JobView], None] | None = None,
                 on_line: Callable[[int | None, str], None] | None = None):
        self.store, self.job, self.cluster, self.backend = store, job, cluster, backend
        self.spec = jobs.spec_of(job)
        self.on_tick, self.on_line = on_tick, on_line
        self.stop_reason: str | None = None
        self.interrupted = False  # ended by Ctrl-C
        self.error: str | None = None
        self.throughput = Throughput()
        self.pending_metrics: list[Metric] = []
        self.lock = threading.Lock()  # pending_metrics: the sampler thread adds to it too
        self.recent = Recent()
        self.telemetry = TelemetryState(self)
        self.model_state: dict[int, dict[str, float]] = {}  # rank -> latest model-state bytes
        self.progress_dirty = False

    # -- signals ------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    def _on_signal(self, signum: int, _frame: object) -> None:
        why = {signal.SIGTERM: "stopped by SIGTERM (gpufleet stop, or the system)",
               signal.SIGHUP: "stopped: the terminal was closed (SIGHUP)"}
        self.request_stop(why.get(signal.Signals(signum), f"stopped by signal {signum}"))

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> Job:
        """Run the job to its end and record the outcome; never raises for a job's failure.

        Whatever happens in here (workers crash, the user stops the job, the supervisor itself
        hits an error), the workers are ended, the devices of a cluster made for the job are
        freed and the job gets a final status.
        """
        _become_subreaper()
        main = threading.current_thread() is threading.main_thread()
        if main:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGHUP, self._on_signal)
        job_dir = Path(self.job.job_dir)
        handle: Handle | None = None
        reader: threading.Thread | None = None
        sink: LogSink | None = None
        sock: socket.socket | None = None
        code: int | None = None
        try:
            sink = LogSink(job_dir, self.job.world_size)
            sock = _report_socket()
            placement = clusters.placements(self.store, self.cluster)[0]
            ctx = JobContext(
                job_name=self.job.name, cluster_name=self.cluster.name, job_dir=job_dir,
                report_addr=f"127.0.0.1:{sock.getsockname()[1]}", fabric=self.cluster.network,
                python=sys.executable, host_cpus=os.cpu_count() or 1,
            )
            layout = self.spec.layout(self.job.world_size)
            cmd = frameworks.build(self.spec, layout, placement, ctx, port=_free_port())
            env = merge_env(dict(os.environ), cmd.env, self.spec.env)
            for file_name, content in cmd.files.items():  # generated framework configs
                (job_dir / file_name).write_text(content)
            (job_dir / "command.json").write_text(json.dumps({"argv": cmd.argv, "env": cmd.env},
                                                             indent=1))
            # Claim the job before starting anything: if `gpufleet stop` got here first (the job
            # is no longer 'starting', or its cluster was stopped), start nothing.
            if not jobs.begin_running(self.store, self.job.id, self.cluster.id,
                                      f"{len(placement.devices)} worker(s) on {self.cluster.name}"):
                self.request_stop(jobs.STOP_REQUESTED)
                return self._done(None, sink)
            self.job.started_at, self.job.status = time.time(), "running"
            handle = self.backend.start(cmd.argv, env, Path(self.spec.workdir or "."))
            reader = threading.Thread(target=self._read_output, args=(handle, sink), daemon=True)
            reader.start()
            self.telemetry.start(handle, placement, env, sink)
            code = self._watch(handle, sock)
        except KeyboardInterrupt:
            self.interrupted = True
            self.request_stop("interrupted by user (Ctrl-C)")
        except Exception as exc:  # recorded on the job; the traceback goes to the job folder
            self.error = f"supervisor error: {type(exc).__name__}: {exc}"
            with contextlib.suppress(OSError):
                (job_dir / "supervisor-error.log").write_text(traceback.format_exc())
        finally:
            if main:  # a second Ctrl-C must not cut the clean-up short and leave workers behind
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.telemetry.stop()
            if handle is not None and self.backend.poll(handle) is None:
                self.backend.kill_tree(handle)
            _end_descendants()
            if reader is not None:
                reader.join(timeout=5)
            if sock is not None:
                self._drain(sock)
                sock.close()
            with contextlib.suppress(Exception):
                self._flush()
            with contextlib.suppress(Exception):  # log rules: OOM, timeouts, for the post-mortem
                self.telemetry.diagnose(time.time(), final=True)
        try:
            return self._done(code, sink)
        finally:
            if main:
                signal.signal(signal.SIGINT, signal.default_int_handler)

    def _done(self, code: int | None, sink: LogSink | None) -> Job:
        self._finish(code, sink)
        if sink is not None:
            sink.close()
        return jobs.get(self.store, self.job.name)

    def _watch(self, handle: Handle, sock: socket.socket) -> int | None:
        last_flush = last_tick = 0.0
        while True:
            code = self.backend.poll(handle)
            if code is not None or self.stop_reason is not None:
                return code
            ready, _, _ = select.select([sock], [], [], 0.2)
            if ready:
                self._drain(sock)
            now = time.time()
            if now - last_flush >= FLUSH_EVERY_S:
                self._flush()
                last_flush = now
            self.telemetry.tick(now)
            if self.on_tick and now - last_tick >= 0.25:
                self.on_tick(self.view(now))
                last_tick = now

    def view(self, now: float | None = None) -> JobView:
        return job_view(self.job, self.cluster, now or time.time(), self.model_state)

    def _read_output(self, handle: Handle, sink: LogSink) -> None:
        assert handle.stdout is not None
        echo = self.on_line
        for raw in iter(handle.stdout.readline, b""):
            # Keep draining whatever happens below: a full pipe would stall every worker.
            try:
                rank, text = sink.write(raw.decode("utf-8", "replace"))
            except OSError:  # disk full: the line is lost, the job goes on
                continue
            # after a stop, torchrun's own shutdown traceback is noise: it stays in the logs only
            if echo is not None and self.stop_reason is None:
                try:
                    echo(rank, text.rstrip("\n"))
                except Exception:  # the terminal went away (`| head`, closed pipe): stop echoing
                    echo = None

    # -- reports --------------------------------------------------------------------------------
    def _drain(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, OSError):
                return
            try:
                rec = json.loads(data)
                self._on_report(rec)
            except (ValueError, TypeError, KeyError, OverflowError):
                continue  # a malformed datagram is not worth failing a job over

    def _on_report(self, rec: dict[str, Any]) -> None:
        # Typed here: the port is open to any local process, and a string in an Integer column
        # would reach the page (a ValueError drops the datagram instead).
        r = Report(t=float(rec["t"]), rank=int(rec["rank"]), step=int(rec["step"]),
                   samples=_opt(int, rec.get("samples")), loss=_opt(float, rec.get("loss")),
                   total_steps=_opt(int, rec.get("total_steps")),
                   samples_total=_opt(int, rec.get("samples_total")))
        if isinstance(rec.get("pid"), int):
            self.telemetry.worker_pid(r.rank, rec["pid"])
        rows = []
        for key, value in rec.items():
            if key in MODEL_STATE_METRICS and isinstance(value, int | float):
                self.model_state.setdefault(r.rank, {})[key] = float(value)
            if key not in _NOT_METRICS and isinstance(value, int | float) \
                    and not isinstance(value, bool):
                self.recent.add(key, r.rank, r.t, float(value))  # NaN too: a diagnosis
                if math.isfinite(value):  # SQL has no NaN; a lost sample, not a lost job
                    rows.append(Metric(
                        time=r.t, cluster=self.cluster.name, job=self.job.name, node="local",
                        rank=r.rank, name=key, value=float(value)))
        with self.lock:
            self.pending_metrics += rows
        if r.rank != 0:
            return
        j = self.job
        self.throughput.add(r)
        if j.first_step_at is None:
            j.first_step_at, j.first_step = r.t, r.step
        j.step, j.last_report_at = r.step, r.t
        j.samples = self.throughput.total_samples
        if r.total_steps is not None:
            j.total_steps = r.total_steps
        if r.loss is not None:
            j.loss = r.loss
            if j.first_loss is None:
                j.first_loss = r.loss
        j.samples_per_s = self.throughput.samples_per_s()
        self.progress_dirty = True

    def add_samples(self, rows: list[Metric]) -> None:
        with self.lock:
            self.pending_metrics += rows

    def _flush(self) -> None:
        with self.lock:
            rows, self.pending_metrics = self.pending_metrics, []
        if not self.progress_dirty and not rows:
            return
        j = self.job
        if self.progress_dirty and j.samples_per_s is not None and j.last_report_at is not None:
            rows.append(Metric(time=j.last_report_at, cluster=self.cluster.name, job=j.name,
                               node="local", rank=JOB_RANK, name="job_samples_per_second",
                               value=j.samples_per_s))
        with self.store.session() as s:
            row = s.get(Job, j.id)
            if row is not None and self.progress_dirty:
                for k in ("step", "total_steps", "samples", "loss", "first_loss", "samples_per_s",
                          "first_step", "first_step_at", "last_report_at"):
                    setattr(row, k, getattr(j, k))
            s.add_all(rows)
        self.progress_dirty = False

    # -- outcome --------------------------------------------------------------------------------
    def _finish(self, code: int | None, sink: LogSink | None) -> None:
        overall = self.throughput.overall_samples_per_s()
        fields: dict[str, object] = {"exit_code": code}
        if overall is not None:
            fields["samples_per_s"] = overall
        if self.error is not None:
            status, reason = "failed", self.error
        elif self.stop_reason is not None and code != 0:
            # `gpufleet stop` leaves its reason on the row before it signals us
            asked = jobs.get(self.store, self.job.name).reason
            status, reason = "stopped", asked if asked == jobs.STOP_REQUESTED else self.stop_reason
        elif code == 0:
            status, reason = "succeeded", "all workers exited 0"
        elif sink is None:
            status, reason = "failed", f"torchrun exited with code {code}"
        else:
            rank, rank_code = failed_rank(sink.tail(None), sink.tails)
            where = f"rank {rank}" if rank is not None else "a worker"
            last = sink.tail(rank)[-8:] if rank is not None else sink.tail(None)[-8:]
            error = last_exception(last)
            status = "failed"
            reason = (f"{where} failed{': ' + error if error else ''} (exit code "
                      f"{rank_code if rank_code is not None else code}); last lines:\n"
                      + "\n".join(last))
        jobs.transition(self.store, self.job.id, status, reason, fields=fields)  # unless final
        self.job = jobs.get(self.store, self.job.name)
        if self.cluster.for_job == self.job.name and not self.spec.keep:
            self.cluster = clusters.stop(self.store, self.cluster.name,
                                         reason=f"job {self.job.name} ended",
                                         cluster_id=self.cluster.id)


def _opt(kind: type[int] | type[float], value: Any) -> Any:
    """`value` as `kind`, None kept; anything else (a string, a list) raises ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r}")
    return kind(value)


def _free_port() -> int:
    """A TCP port free on loopback now, for launchers that need one named (Accelerate)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _report_socket() -> socket.socket:
    """The UDP socket workers report to, on a free loopback port, with a large receive buffer
    so a burst of reports waits in the kernel while we write to the store."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def _end_descendants() -> None:
    """Kill anything still below us (workers re-parented to us as subreaper).

    A supervisor owns its process: it runs as the `gpufleet run` command or as a detached
    `python -m gpufleet.supervise.supervisor`, never inside a program with other children.
    """
    try:
        left = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    kill(left)


def main(argv: list[str] | None = None) -> int:
    """Entry point of a detached supervisor: `python -m gpufleet.supervise.supervisor JOB`."""
    from gpufleet.store import Cluster as ClusterRow

    args = argv if argv is not None else sys.argv[1:]
    store = Store()
    job = jobs.get(store, args[0])
    with store.session() as s:
        cluster = s.get(ClusterRow, job.cluster_id)
    assert cluster is not None
    done = Supervisor(store, job, cluster, LocalBackend()).run()
    return 0 if done.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
