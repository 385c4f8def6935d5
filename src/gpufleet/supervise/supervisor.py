"""One supervisor per job: start the workers, follow their output and reports, record the outcome.

It runs inside `gpufleet run` (foreground) or as its own detached process (`--detach`). Either
way the store is the only thing other commands read, so `status`, `list` and `logs` work the same.

Every decision (restart or give up, hung, resize, heal, the final status) is `machine.step`'s;
this loop only turns I/O into the machine's events (a backend poll, a report datagram, a
signal, the clock, the control file) and its actions into I/O (see `actions.py`). The I/O's
state (the job and cluster rows, the running workers, the logs and socket) is one
`run_state.RunState`, which `actions` and `telemetry` are handed instead of the supervisor.
"""

from __future__ import annotations

import contextlib
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

from gpufleet import durable_copy
from gpufleet.backends.base import Backend
from gpufleet.lifecycle import jobs
from gpufleet.reportauth import new_key
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Job, Store
from gpufleet.supervise import events as ev
from gpufleet.supervise import machine, report_port
from gpufleet.supervise.actions import Effects
from gpufleet.supervise.elastic import elastic_plan, mean_utilization
from gpufleet.supervise.intake import Intake
from gpufleet.supervise.logs import LogSink
from gpufleet.supervise.notes import opt_number
from gpufleet.supervise.output import OutputLines
from gpufleet.supervise.run_state import RunState
from gpufleet.supervise.store_watch import StoreLost, StoreWatch
from gpufleet.supervise.telemetry import TelemetryState
from gpufleet.supervise.view import JobView, job_view, requested_layout
from gpufleet.telemetry.log_progress import total_steps_in

FLUSH_EVERY_S = 0.25  # reports reach the store (and the dashboard) at most this late
_opt = opt_number  # its older name
__all__ = ["Supervisor", "main"]


class Supervisor:
    """One job's supervisor: the machine's state, and the I/O around it (the backend's process
    tree, the report socket, the logs, the store), whose state is its `run_state`. `run()`
    drives it to the job's end."""

    def __init__(self, store: Store, job: Job, cluster: Cluster, backend: Backend,
                 on_tick: Callable[[JobView], None] | None = None,
                 on_line: Callable[[int | None, str], None] | None = None):
        spec = jobs.spec_of(job)
        self.on_tick = on_tick
        self.stop_reason: str | None = None  # set by a signal; the loop hands it to the machine
        # signs the job's reports (reportauth); reaches the workers through their environment
        # only, never a file, a log or the store
        report_key = new_key()
        intake = Intake(job, cluster, report_key)
        intake.requested_layout = requested_layout(job.spec_json, job.world_size)
        # an SDK script reports even with the bootstrap off: its silence counts from the start
        intake.reports_expected = _imports_gpufleet(spec.script, spec.workdir)
        if job.total_steps is None:  # a report's total, when one comes, wins
            job.total_steps = spec.total_steps or total_steps_in(spec.args)
            intake.progress_dirty = job.total_steps is not None
        policy, allowed, workers = elastic_plan(spec, job.world_size)
        self.run_state = RunState(
            store=store, backend=backend, spec=spec, policy=policy, report_key=report_key,
            intake=intake, lines=OutputLines(intake, spec.loss_pattern, on_line), job=job,
            cluster=cluster)
        config = machine.Config(
            cluster_name=cluster.name, max_restarts=spec.max_restarts,
            hang_timeout_s=spec.hang_timeout_s, policy=policy, allowed=tuple(allowed),
            heals=backend.capabilities.multi_node, durable=bool(spec.checkpoint_to),
            time_limit_s=spec.time_limit_s,
            usd_per_device_hour=cluster.usd_per_hour / cluster.count if cluster.count else 0.0)
        copied = durable_copy.state((e.kind, e.reason) for e in jobs.events(store, job.id))
        self.state = machine.initial(config, workers, job.step,
                                     copied.step if copied is not None else None)
        self.telemetry = TelemetryState(self.run_state)
        self.effects = Effects(self.run_state, self.telemetry, self.stopping)
        self.store_watch = StoreWatch(store.path)  # the state file removed under the job
        self.lost: StoreLost | None = None  # set when it was: nothing more goes to the store

    @property
    def interrupted(self) -> bool:
        """Ended by Ctrl-C."""
        return self.state.interrupted

    @property
    def workers(self) -> int:
        return self.state.workers

    def view(self, now: float | None = None) -> JobView:
        run = self.run_state
        return job_view(run.job, run.cluster, now or time.time(), run.intake.model_state,
                        run_started_at=self.state.started_at or None)

    # -- signals ------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    def _on_signal(self, signum: int, _frame: object) -> None:
        why = {signal.SIGTERM: "stopped by SIGTERM (gpufleet stop, or the system)",
               signal.SIGHUP: "stopped: the terminal was closed (SIGHUP)"}
        self.request_stop(why.get(signal.Signals(signum), f"stopped by signal {signum}"))

    def stopping(self) -> bool:
        return self.stop_reason is not None or self.state.stop_reason is not None

    # -- the machine ----------------------------------------------------------------------------
    def feed(self, event: ev.Event) -> None:
        """Step the machine, carry out its actions, then the events those produced."""
        follow_ups = self.run_state.follow_ups
        follow_ups.append(event)
        while follow_ups:
            self.state, actions = machine.step(self.state, follow_ups.popleft(), time.time())
            for action in actions:
                self.effects.do(action)

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> Job:
        """Run the job to its end and record the outcome; never raises for a job's failure.

        The workers may start several times: after a failure (up to --max-restarts, from the
        last checkpoint) and at every elastic resize. Whatever happens in here (workers crash
        or hang, the user stops the job, the supervisor itself hits an error), the workers are
        ended, the devices of a cluster made for the job are freed and the job gets a final
        status.
        """
        run = self.run_state
        run.backend.adopt_orphans()
        main = threading.current_thread() is threading.main_thread()
        if main:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGHUP, self._on_signal)
        job_dir = Path(run.job.job_dir)
        try:
            run.opened(LogSink(job_dir, run.job.world_size),
                       report_port.open_socket(run.backend.report_host()))
            assert run.sock is not None
            # Claim the job before starting anything: if `gpufleet stop` got here first (the job
            # is no longer 'starting', or its cluster was stopped), start nothing.
            if jobs.begin_running(run.store, run.job.id, run.cluster.id,
                                  f"{self.workers} worker(s) on {run.cluster.name}"):
                run.job_moved(JobStatus.RUNNING, {"started_at": time.time()})
                self.feed(ev.Begin())
                self._loop(run.sock)
            else:
                self.request_stop(jobs.STOP_REQUESTED)
                self.feed(ev.StopRequested(jobs.STOP_REQUESTED))
        except StoreLost as exc:
            self.lost = exc
            if run.sink is not None:
                with contextlib.suppress(OSError):
                    run.sink.write(f"gpufleet: {exc}\n")
        except KeyboardInterrupt:
            self.request_stop(machine.INTERRUPTED_REASON)
            run.follow_ups.clear()  # what the cut-short actions had queued is moot
            self.feed(ev.Interrupted())
        except Exception as exc:  # recorded on the job; the traceback goes to the job folder
            run.follow_ups.clear()
            self.feed(ev.SupervisorFailed(f"supervisor error: {type(exc).__name__}: {exc}"))
            with contextlib.suppress(OSError):
                (job_dir / "supervisor-error.log").write_text(traceback.format_exc())
        finally:
            if main:  # a second Ctrl-C must not cut the clean-up short and leave workers behind
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.effects.end_workers(10.0, over=True)  # the job ends here
            if run.sock is not None and self.lost is None:
                self._drain(run.sock)
            run.closed()
            with contextlib.suppress(Exception):
                if self.lost is None:  # the store is gone: write nothing to it
                    self._note_dropped(final=True)
            with contextlib.suppress(Exception):
                if self.lost is None:
                    run.intake.flush(run.store)
            with contextlib.suppress(Exception):  # log rules: OOM, timeouts, for the post-mortem
                if self.lost is None:
                    self.telemetry.diagnose(time.time(), self.state, final=True)
        if self.lost is not None:
            if run.sink is not None:
                run.sink.close()
            raise self.lost
        try:
            return self.effects.finish(self.state, run.sink)
        finally:
            if main:
                signal.signal(signal.SIGINT, signal.default_int_handler)

    def _loop(self, sock: socket.socket) -> None:
        while self.state.phase != "done":
            if self.stop_reason is not None and self.state.stop_reason is None:
                self.feed(ev.StopRequested(self.stop_reason))
            elif self.state.phase == "backoff":
                self._pause()
            elif self.state.phase == "running":
                self._watch(sock)
            else:  # healing and reshaping finish inside their actions
                raise RuntimeError(f"the supervisor's machine is stuck in {self.state.phase}")

    def _pause(self) -> None:
        """Back off before a restart, still answering `gpufleet stop`."""
        run = self.run_state
        while self.stop_reason is None and time.monotonic() < run.backoff_until:
            time.sleep(min(0.1, max(0.0, run.backoff_until - time.monotonic())))
        if self.stop_reason is None:
            self.feed(ev.BackoffOver())

    def _watch(self, sock: socket.socket) -> None:
        """One turn of the loop while the workers run: their exit, reports, the clock."""
        run = self.run_state
        assert run.handle is not None
        code, parked = run.backend.poll(run.handle), run.parked
        if code is not None:
            self._exited(code, sock)
            return
        if parked is not None:  # the launcher waits with its workers ended (warm_restart.py)
            self._exited(parked, sock, in_place=True)
            return
        if self.stop_reason is not None:
            return
        self.store_watch.check(time.monotonic())
        assert run.wake is not None
        ready, _, _ = select.select([sock.fileno(), run.wake[0]], [], [], 0.2)
        if run.wake[0] in ready:
            os.read(run.wake[0], 64)
        if sock.fileno() in ready:
            self._drain(sock)
        now = time.time()
        if now - self.effects.last_flush >= FLUSH_EVERY_S:
            run.intake.flush(run.store)
            self.effects.last_flush = now
        self.feed(self._tick(now))
        if self.state.phase != "running":
            return
        self.telemetry.tick(now, self.state)
        if self.on_tick and now - self.effects.last_tick >= 0.25:
            self.on_tick(self.view(now))
            self.effects.last_tick = now

    def _tick(self, now: float) -> ev.Tick:
        state, intake = self.state, self.run_state.intake
        stopped = report_port.stopped(intake.worker_pids) \
            if machine.needs_process_states(state, now) else {}
        due = self._policy_due(now)
        util = self._utilization(now) if due else ()
        free = self.effects.free_devices(state.workers) \
            if machine.needs_free_devices(state, now, util) else None
        return ev.Tick(util, stopped, free, intake.progress_marks() if due else ())

    def _policy_due(self, now: float) -> bool:
        """Whether an elastic decision (or a resize's verdict) is due: only then does the Tick
        carry the utilization and the run's reports."""
        return self.run_state.policy is not None and self.state.training_since is not None and \
            now - self.state.last_policy >= machine.POLICY_EVERY_S

    def _utilization(self, now: float) -> tuple[tuple[float, float], ...]:
        """The mean utilization of the job's devices per second since training started."""
        since = self.state.training_since or now
        recent = self.run_state.recent.snapshot(now)
        return mean_utilization(recent.get("gpu_utilization", {}), since)

    def _exited(self, code: int, sock: socket.socket, in_place: bool = False) -> None:
        """The workers ended with `code`: with their launcher (`in_place` False), or while it
        waits to restart them (launch/warm_restart.py), which a restart reuses."""
        run = self.run_state
        if in_place:
            self.telemetry.stop()
        else:
            self.effects.end_workers(10.0)
        self._drain(sock)  # the last reports, e.g. the exit for a resize
        seq = self.effects.acknowledged()
        if seq is not None:
            self.feed(ev.ResizeAcknowledged(seq))
        if code == 0 or run.sink is None:
            self.feed(ev.WorkersExited(code))
            return
        agent = run.sink.agent_lines()
        lost = run.backend.node_lost(code, agent)
        if lost is not None:  # a node went away: its peers' errors are knock-on effects
            self.feed(ev.WorkersExited(code, None, None, lost, "\n".join(agent[-8:]),
                                       node_lost=True))
            return
        # the failing rank's error record (its exception, its traceback), else the log tails
        tail = run.sink.failure(run.cluster.nodes == 1)
        self.telemetry.blamed_rank = tail.rank  # the diagnosis names the rank the reason does
        self.feed(ev.WorkersExited(code, tail.rank, tail.rank_code, tail.error,
                                   "\n".join(tail.last)))

    def _drain(self, sock: socket.socket) -> None:
        intake = self.run_state.intake
        for data in report_port.pending(sock):
            for item in intake.datagram(data, self._pid_ok):
                if isinstance(item, ev.RecordEvent):
                    self.effects.do(item)
                else:
                    self.feed(item)
        self._note_dropped()
        for rank, pid in intake.worker_pids.items():
            self.telemetry.worker_pid(rank, pid)

    def _note_dropped(self, final: bool = False) -> None:
        record = self.run_state.intake.dropped_note(time.time(), final)
        if record is not None:
            self.effects.do(record)

    def _pid_ok(self, pid: int) -> bool:
        run = self.run_state
        return run.backend.pids_here and report_port.holds_key(pid, run.report_key)


def _imports_gpufleet(script: str, workdir: str | None) -> bool:
    from gpufleet.launch.script_scan import imports_gpufleet

    try:
        return imports_gpufleet((Path(workdir or ".") / script).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Entry point of a detached supervisor: `python -m gpufleet.supervise.supervisor JOB`."""
    from gpufleet.lifecycle import pools
    from gpufleet.store import Cluster as ClusterRow

    args = argv if argv is not None else sys.argv[1:]
    store = Store()
    job = jobs.get(store, args[0])
    with store.session() as s:
        cluster = s.get(ClusterRow, job.cluster_id)
    assert cluster is not None
    backend = pools.backend_for(pools.pool_of(store, cluster))
    try:
        done = Supervisor(store, job, cluster, backend).run()
    except StoreLost as exc:  # the line in the job's log, and here in supervisor.log
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 1
    return 0 if done.status == JobStatus.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
