"""One supervisor per job: start torchrun, follow its output and reports, record the outcome.

It runs inside `gpufleet run` (foreground) or as its own detached process (`--detach`). Either
way the store is the only thing other commands read, so `status`, `list` and `logs` work the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import math
import os
import re
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gpufleet.backends.local import Handle, free_port, kill
from gpufleet.backends.ray_run import NODE_LOST_EXIT
from gpufleet.errors import GpufleetError
from gpufleet.launch import frameworks
from gpufleet.launch.torchrun import JobContext, merge_env
from gpufleet.lifecycle import clusters, jobs
from gpufleet.spec import JobSpec
from gpufleet.store import Cluster, Job, Metric, Store
from gpufleet.supervise import elastic, hang, restarts
from gpufleet.supervise.logs import LogSink, failed_rank, last_exception
from gpufleet.supervise.progress import Report, Throughput
from gpufleet.supervise.telemetry import TelemetryState
from gpufleet.supervise.view import MODEL_STATE_METRICS, JobView, job_view
from gpufleet.telemetry.recent import Recent
from gpufleet.telemetry.schema import DEVICE_METRICS, JOB_RANK

FLUSH_EVERY_S = 0.25  # reports reach the store (and the dashboard) at most this late
_NOT_METRICS = ("t", "rank", "step", "total_steps", "samples_total", "pid")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Outcome:
    """How one run of the worker group ended."""

    kind: str  # exit | stop | hang
    code: int | None
    hang: hang.Hang | None = None
    rank: int | None = None  # for a failed exit: the rank that caused it, its code, its error
    rank_code: int | None = None
    error: str | None = None
    last_lines: str = ""


def _become_subreaper() -> None:
    """Orphaned workers (their torchrun died first) re-parent to us, so we can still end them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, store: Store, job: Job, cluster: Cluster, backend: Any,
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
        # surviving: runs of the worker group, failures, checkpoints, elastic size
        self.runs = 0
        self.samples_before = 0
        self.handle: Handle | None = None
        self.reader: threading.Thread | None = None
        self.hung = False
        self.started_at = time.time()
        self.failures: list[restarts.Failure] = []
        self.final_failure: str | None = None
        self.checkpoint_step: int | None = None
        self.has_checkpointer = False
        self.ever_reported = False
        self.exited_for_resize = False
        self.training_since: float | None = None
        self.last_seen: dict[int, tuple[float, int]] = {}
        self.worker_pids: dict[int, int] = {}
        self.control_seq = 0
        self.resize_target: int | None = None
        self.resize_deadline: float | None = None
        self.last_scale_note = ""
        self.free_cache: tuple[float, int] | None = None
        self.policy, self.allowed, self.workers = elastic_plan(self.spec, job.world_size)
        self.on_ray = getattr(backend, "name", "local") == "ray"
        # worker pids in reports name processes on this machine only for a pool on loopback
        self.pids_here = not self.on_ray or _loopback(getattr(backend, "address", ""))

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

        The workers may start several times: after a failure (up to --max-restarts, from the
        last checkpoint) and at every elastic resize. Whatever happens in here (workers crash
        or hang, the user stops the job, the supervisor itself hits an error), the workers are
        ended, the devices of a cluster made for the job are freed and the job gets a final
        status.
        """
        _become_subreaper()
        main = threading.current_thread() is threading.main_thread()
        if main:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGHUP, self._on_signal)
        job_dir = Path(self.job.job_dir)
        sink: LogSink | None = None
        sock: socket.socket | None = None
        code: int | None = None
        try:
            sink = LogSink(job_dir, self.job.world_size)
            sock = _report_socket(self._report_host())
            # Claim the job before starting anything: if `gpufleet stop` got here first (the job
            # is no longer 'starting', or its cluster was stopped), start nothing.
            if not jobs.begin_running(self.store, self.job.id, self.cluster.id,
                                      f"{self.workers} worker(s) on {self.cluster.name}"):
                self.request_stop(jobs.STOP_REQUESTED)
                return self._done(None, sink)
            self.job.started_at, self.job.status = time.time(), "running"
            code = self._runs(job_dir, sink, sock)
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
            self._end_workers(sink)
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

    def _runs(self, job_dir: Path, sink: LogSink, sock: socket.socket) -> int | None:
        """Start the workers, watch them, and start them again after a failure or for a
        resize, until the job ends; the last exit code."""
        while True:
            outcome = self._run_once(job_dir, sink, sock)
            left_for_resize = outcome.kind == "exit" and outcome.code == 0 and (
                self.exited_for_resize or self._exit_acknowledged())
            if outcome.kind == "stop" or self.stop_reason is not None:
                self.exited_for_resize = left_for_resize
                return outcome.code
            if outcome.kind == "exit" and outcome.code == 0 and not left_for_resize:
                return outcome.code
            if left_for_resize:  # the workers saved and left
                self._resize(sink)
                continue
            self.resize_target = self.resize_deadline = None  # a failure ends a pending resize
            failure = self._failure(outcome, sink)
            self.failures.append(failure)
            decision = restarts.decide(self.failures, self.spec.max_restarts)
            jobs.add_event(self.store, self.job.id,
                           "hang" if outcome.kind == "hang" else "worker_failed", failure.description
                           + (f"\nlast lines:\n{outcome.last_lines}" if outcome.last_lines else ""))
            if not decision.restart:
                if self.spec.max_restarts or outcome.kind == "hang":
                    self.final_failure = decision.reason + (
                        f"; last lines:\n{outcome.last_lines}" if outcome.last_lines else "")
                return outcome.code  # else the failure reads as it always has (see _finish)
            lost = restarts.steps_lost(failure)
            since = (f"the checkpoint at step {failure.checkpoint_step}"
                     if failure.checkpoint_step else "the start (no checkpoint yet)")
            when = "now" if decision.delay_s == 0 else f"in {decision.delay_s:.0f} s"
            note = (f"{decision.reason} {when}, from {since}"
                    + (f"; {lost} step(s) are redone" if lost is not None else ""))
            jobs.transition(self.store, self.job.id, "restarting", f"{failure.description}; {note}")
            self._say(f"{failure.description}; {note}")
            self._pause(decision.delay_s)
            if self.stop_reason is not None:
                return outcome.code
            sink.new_run(f"restart {len(self.failures)}: {failure.description}")

    def _run_once(self, job_dir: Path, sink: LogSink, sock: socket.socket) -> Outcome:
        """One run of the worker group at the current size, until it exits, hangs, is
        stopped, or leaves for a resize."""
        self.runs += 1
        self.exited_for_resize = False
        self.last_seen, self.worker_pids = {}, {}
        self.training_since = None
        self.samples_before = self.job.samples or 0  # reports count from 0 in each run
        self.throughput = Throughput()
        self.job.first_step = self.job.first_step_at = None
        if self.on_ray and self.runs > 1:
            self._heal()
        placements = clusters.placements(self.store, self.cluster)
        placement = dataclasses.replace(placements[0], devices=placements[0].devices[: self.workers])
        spec = self.spec
        if self.policy is not None:
            spec = spec.model_copy(update={"workers_per_node": self.workers})
        ctx = JobContext(
            job_name=self.job.name, cluster_name=self.cluster.name, job_dir=job_dir,
            report_addr=f"{sock.getsockname()[0]}:{sock.getsockname()[1]}",
            fabric=self.cluster.network, python=sys.executable, host_cpus=os.cpu_count() or 1,
        )
        layout = spec.layout(self.workers)
        if self.on_ray:
            cmd = self._ray_command(spec, layout, placements, ctx)
        else:
            cmd = frameworks.build(spec, layout, placement, ctx, port=free_port())
        env = merge_env(dict(os.environ), {**cmd.env, **self._survive_env(job_dir)}, spec.env)
        for file_name, content in cmd.files.items():  # generated framework configs
            (job_dir / file_name).write_text(content)
        (job_dir / "command.json").write_text(json.dumps({"argv": cmd.argv, "env": cmd.env},
                                                         indent=1))
        for stale in (self._control_path(), Path(f"{self._control_path()}.exited")):
            stale.unlink(missing_ok=True)  # requests to earlier workers (or an earlier supervisor)
        if self.runs > 1:
            jobs.transition(self.store, self.job.id, "running",
                            f"{self.workers} worker(s) on {self.cluster.name} (run {self.runs})",
                            fields={"world_size": self.workers})
            self.job.status, self.job.world_size = "running", self.workers
        self.started_at = time.time()
        self.handle = self.backend.start(cmd.argv, env, Path(spec.workdir or "."))
        self.reader = threading.Thread(target=self._read_output, args=(self.handle, sink),
                                       daemon=True)
        self.reader.start()
        self.telemetry.start(self.handle, placement, env, sink, sample=not self.on_ray)
        outcome = self._watch(self.handle, sock)
        self._end_workers(sink)
        if outcome.kind == "exit":
            self._drain(sock)  # the last reports, e.g. the exit for a resize
        if outcome.kind == "exit" and outcome.code not in (0, None):
            rank, rank_code = failed_rank(sink.tail(None), sink.tails)
            last = sink.tail(rank)[-8:] if rank is not None else sink.tail(None)[-8:]
            lost = next((ln for ln in reversed(sink.tail(None)) if ln.startswith("NodeLostError")),
                        None) if outcome.code == NODE_LOST_EXIT else None
            if lost is not None:  # a node went away: its peers' errors are knock-on effects
                rank, rank_code, last = None, None, sink.tail(None)[-8:]
            outcome = dataclasses.replace(outcome, rank=rank, rank_code=rank_code,
                                          error=lost or last_exception(last),
                                          last_lines="\n".join(last))
        return outcome

    # -- many nodes (a Ray pool) ------------------------------------------------------------------
    def _ray_command(self, spec: JobSpec, layout: Any, placements: list[Any],
                     ctx: JobContext) -> frameworks.NodeCommand:
        """Write the plan for the Ray driver and return the command that runs it."""
        from gpufleet.launch import multinode

        job_dir = Path(self.job.job_dir)
        nodes = {n.id: n for n in self.backend.discover()}
        missing = [p.node_id for p in placements if p.node_id not in nodes]
        if missing:
            raise GpufleetError(f"node(s) {', '.join(missing)} of cluster {self.cluster.name} "
                                "are not in the Ray cluster")
        head = placements[0].address
        loopback = _loopback(head)
        plan = multinode.plan(
            spec, layout, placements, nodes, ctx, port=free_port(head if loopback else ""),
            run_id=f"{self.job.name}-{self.runs}",
            user_env={**self._survive_env(job_dir), **spec.env}, ready_timeout_s=60.0,
            address=self.backend.address, loopback=loopback,
            memory_per_slot=psutil.virtual_memory().total // max(1, self.cluster.count))
        path = job_dir / "ray-plan.json"
        path.write_text(json.dumps(plan, indent=1))
        files = {k: v for n in plan["nodes"] for k, v in n["files"].items()}
        return frameworks.NodeCommand(self.backend.driver_argv(path), {
            "GPUFLEET_JOB": self.job.name, "PYTHONUNBUFFERED": "1"}, files)

    def _heal(self) -> None:
        """Before a restart on a Ray pool: replace lost nodes (or go on without them). The
        driver names the nodes it lost; Ray may not have marked them dead yet."""
        lost_file = Path(self.job.job_dir) / "ray-plan.lost"
        try:
            lost = set(json.loads(lost_file.read_text()))
            lost_file.unlink()
        except (OSError, ValueError):
            lost = set()
        nodes = [dataclasses.replace(n, healthy=False) if n.id in lost else n
                 for n in self.backend.discover()]
        self.cluster, notes = clusters.heal(self.store, self.cluster, nodes)
        for note in notes:
            jobs.add_event(self.store, self.job.id, "node_replaced", note)
            self._say(note)
        if self.spec.workers_per_node is None:
            self.workers = self.cluster.count
        else:
            self.workers = self.spec.workers_per_node * self.cluster.nodes

    def _report_host(self) -> str:
        """Where workers send reports: loopback, unless the job's nodes are other machines (a
        remote Ray pool), which reach us at the address our route to the pool leaves from."""
        address = getattr(self.backend, "address", "")
        if not self.on_ray or _loopback(address):
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address.rsplit(":", 1)[0], 9))  # UDP: picks a route, sends nothing
            return str(probe.getsockname()[0])

    def _control_path(self) -> Path:
        return Path(self.job.job_dir) / "control.json"

    def _exit_acknowledged(self) -> bool:
        """The workers' own word (a file, in case the datagram was lost) that they exited to be
        resized in answer to our latest request."""
        try:
            seen = int(Path(f"{self._control_path()}.exited").read_text())
        except (OSError, ValueError):
            return False
        return self.resize_target is not None and seen == self.control_seq

    def _request(self, action: str) -> None:
        self.control_seq += 1
        control = self._control_path()
        tmp = control.with_name("control.json.tmp")
        tmp.write_text(json.dumps({"seq": self.control_seq, "action": action}))
        os.replace(tmp, control)

    def _survive_env(self, job_dir: Path) -> dict[str, str]:
        """Where checkpoints go and how the supervisor asks for one, for `train.Checkpointer`."""
        env = {"GPUFLEET_CHECKPOINT_DIR": str(job_dir / "checkpoints"),
               "GPUFLEET_CONTROL_FILE": str(job_dir / "control.json"),
               "GPUFLEET_RUN": str(self.runs)}
        if self.spec.checkpoint_to:
            env["GPUFLEET_CHECKPOINT_TO"] = self.spec.checkpoint_to
        if self.policy is not None:
            env["GPUFLEET_GRAD_ACCUM"] = str(elastic.grad_accum(self.policy, self.workers))
        return env

    def _end_workers(self, sink: LogSink | None) -> None:
        """Stop sampling and end this run's process tree (a stopped process too: SIGKILL
        reaches it where SIGTERM waits for a SIGCONT)."""
        self.telemetry.stop()
        handle = self.handle
        if handle is not None and self.backend.poll(handle) is None:
            self.backend.kill_tree(handle, grace_s=0.0 if self.hung else 10.0)
        _end_descendants()
        if self.reader is not None:
            self.reader.join(timeout=5)
        self.handle, self.reader, self.hung = None, None, False

    def _failure(self, outcome: Outcome, sink: LogSink) -> restarts.Failure:
        if outcome.kind == "hang" and outcome.hang is not None:
            return restarts.Failure(
                signature=f"hang: rank {outcome.hang.rank}", description=outcome.hang.description,
                step=self.job.step, checkpoint_step=self.checkpoint_step)
        exit_text = restarts.describe_exit(outcome.rank_code if outcome.rank_code is not None
                                           else outcome.code)
        where = f"rank {outcome.rank}" if outcome.rank is not None else "a worker"
        description = f"{where} failed ({exit_text})" + (f": {outcome.error}" if outcome.error
                                                           else "")
        return restarts.Failure(signature=restarts.signature(outcome.rank, exit_text, outcome.error),
                                description=description, step=self.job.step,
                                checkpoint_step=self.checkpoint_step)

    def _pause(self, seconds: float) -> None:
        """Back off before a restart, still answering `gpufleet stop`."""
        end = time.monotonic() + seconds
        while self.stop_reason is None and time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    def _say(self, text: str) -> None:
        if self.on_line is not None:
            with contextlib.suppress(Exception):
                self.on_line(None, f"gpufleet: {text}")

    def _done(self, code: int | None, sink: LogSink | None) -> Job:
        self._finish(code, sink)
        if sink is not None:
            sink.close()
        return jobs.get(self.store, self.job.name)

    def _watch(self, handle: Handle, sock: socket.socket) -> Outcome:
        last_flush = last_tick = last_policy = 0.0
        while True:
            code = self.backend.poll(handle)
            if code is not None:
                return Outcome("exit", code)
            if self.stop_reason is not None:
                return Outcome("stop", None)
            ready, _, _ = select.select([sock], [], [], 0.2)
            if ready:
                self._drain(sock)
            now = time.time()
            if now - last_flush >= FLUSH_EVERY_S:
                self._flush()
                last_flush = now
            found = self._hang(now)
            if found is not None:
                self.hung = True
                return Outcome("hang", None, hang=found)
            if now - last_policy >= 1.0:
                last_policy = now
                self._autoscale(now)
            self.telemetry.tick(now)
            if self.on_tick and now - last_tick >= 0.25:
                self.on_tick(self.view(now))
                last_tick = now

    def _hang(self, now: float) -> hang.Hang | None:
        timeout = self.spec.hang_timeout_s * (2 if self.resize_deadline is not None else 1)
        if self.last_seen and now - max(t for t, _ in self.last_seen.values()) <= timeout:
            return None  # the common case, without a look at every worker process
        stopped: dict[int, bool] = {}
        for rank, pid in self.worker_pids.items():
            try:
                stopped[rank] = psutil.Process(pid).status() == psutil.STATUS_STOPPED
            except psutil.Error:
                stopped[rank] = False
        # The timeout is doubled while saving for a resize. Before the first report, a script
        # that reported in an earlier run gets the timeout plus start-up time; one that never
        # reported is not judged by reports.
        startup = timeout + 120.0 if self.ever_reported else None
        return hang.find(now, self.last_seen, self.started_at, timeout, stopped, startup)

    # -- elastic --------------------------------------------------------------------------------
    def _autoscale(self, now: float) -> None:
        policy = self.policy
        if self.resize_deadline is not None and now > self.resize_deadline:
            # The workers keep reporting but never reached ckpt.step() (a long evaluation,
            # say): give up this resize rather than stay 'resizing' for ever.
            jobs.add_event(self.store, self.job.id, "scale_blocked",
                           f"resize to {self.resize_target} abandoned: the workers did not save "
                           f"within {2 * self.spec.hang_timeout_s:.0f} s")
            self.resize_target = self.resize_deadline = None
            self._request("none")  # supersedes the request, if no rank has read it yet
            jobs.transition(self.store, self.job.id, "running", "resize abandoned")
            self.job.status = "running"
        if policy is None or self.resize_target is not None or self.training_since is None:
            return
        series = self.recent.snapshot(now).get("gpu_utilization", {})
        by_time: dict[float, list[float]] = {}
        for points in series.values():
            for t, v in points:
                if t >= self.training_since:
                    by_time.setdefault(round(t), []).append(v)
        util = sorted((t, sum(vs) / len(vs)) for t, vs in by_time.items())
        decision = elastic.decide(policy, self.allowed, self.workers, util, now,
                                  self.training_since, free=policy.max_workers)
        if decision.workers > self.workers:  # only growing needs the pool (a discovery)
            decision = elastic.decide(policy, self.allowed, self.workers, util, now,
                                      self.training_since, self._free_devices())
        if decision.workers == self.workers:
            if "free device" in decision.reason:
                self._note_blocked(decision.reason)
            else:
                self.last_scale_note = ""
            return
        if not self.has_checkpointer:
            self._note_blocked(f"would resize {self.workers} -> {decision.workers} "
                               f"({decision.reason}), but the script has no "
                               "gpufleet.train.Checkpointer: a resize would lose its progress")
            return
        self.resize_target = decision.workers
        self.resize_deadline = now + 2 * self.spec.hang_timeout_s
        self._request("save_exit")
        reason = f"{self.workers} -> {decision.workers} workers: {decision.reason}"
        jobs.transition(self.store, self.job.id, "resizing", reason)
        self.job.status = "resizing"
        self._say(f"resizing {reason}")

    def _note_blocked(self, reason: str) -> None:
        """One event per kind of refusal, not one a second: the figures in it change."""
        key = re.sub(r"\d+(\.\d+)?", "#", reason)
        if key != self.last_scale_note:
            jobs.add_event(self.store, self.job.id, "scale_blocked", reason)
            self.last_scale_note = key

    def _free_devices(self) -> int:
        """Devices the job could grow by: its cluster's own idle ones, plus, for a cluster made
        for it, free ones of its type in the pool (looked up at most every 10 s)."""
        idle = max(0, self.cluster.count - self.workers)
        if self.cluster.for_job != self.job.name:
            return idle  # a shared cluster: grow within it only
        now = time.monotonic()
        if self.free_cache is None or now - self.free_cache[0] > 10.0:
            self.free_cache = (now, clusters.free_count(self.store, self.cluster,
                                                        self.backend.discover()))
        return idle + self.free_cache[1]

    def _resize(self, sink: LogSink) -> None:
        """The workers saved and exited: change the reservation (a cluster made for this job)
        and start again at the new size, or at the old one if the devices went meanwhile."""
        target, self.resize_target, self.resize_deadline = self.resize_target, None, None
        before = self.workers
        if target is None:  # the workers answered a request we had abandoned: same size again
            target = before
        self.free_cache = None
        if self.cluster.for_job == self.job.name:
            try:
                self.cluster = clusters.resize(self.store, self.cluster.id, target,
                                               self.backend.discover())
            except GpufleetError as exc:
                jobs.add_event(self.store, self.job.id, "scale_blocked",
                               f"{before} -> {target} workers: {exc}; staying at {before}")
                target = before
        self.workers = target
        jobs.add_event(self.store, self.job.id, "resized",
                       f"{before} -> {target} workers from the checkpoint at step "
                       f"{self.checkpoint_step}; each rank accumulates "
                       f"{elastic.grad_accum(self.policy, target) if self.policy else 1} "
                       "micro-batch(es) per step")
        sink.new_run(f"resized {before} -> {target} workers")

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

    def _on_event(self, rec: dict[str, Any]) -> None:
        """A lifecycle note from the Checkpointer, recorded as a job event."""
        kind = str(rec["event"])
        step = _opt(int, rec.get("step"))
        rank = int(rec["rank"])
        if rank in self.last_seen:  # a sign of life, but only reports start the hang clock
            self.last_seen[rank] = (time.time(), self.last_seen[rank][1])
        if kind == "checkpointer":
            self.has_checkpointer = True
        elif kind == "checkpoint":
            self.checkpoint_step = step
            size = _opt(float, rec.get("bytes")) or 0.0
            blocked = _opt(float, rec.get("blocked_s")) or 0.0
            mode = "async" if rec.get("async_save") else "sync"
            jobs.add_event(self.store, self.job.id, "checkpoint",
                           f"step {step} saved ({size / 1e6:.1f} MB, {mode}; training blocked "
                           f"{blocked:.3f} s)")
        elif kind == "checkpoint_copied":
            jobs.add_event(self.store, self.job.id, "checkpoint_copied",
                           f"step {step} copied to {str(rec.get('path'))[:300]}")
        elif kind in ("checkpoint_skipped", "checkpoint_copy_failed"):
            jobs.add_event(self.store, self.job.id, kind,
                           f"step {step}: {str(rec.get('why'))[:300]}")
        elif kind == "resumed":
            self.checkpoint_step = step
            jobs.add_event(self.store, self.job.id, "resumed", f"from the checkpoint at step {step}")
        elif kind == "exit_for_resize":
            self.exited_for_resize = True

    def _on_samples(self, rec: dict[str, Any]) -> None:
        """Device samples from a node's agent (a Ray pool), keyed by the device's position in
        the cluster and labelled node/device."""
        node = str(rec["node"])[:32]
        t = float(rec["t"])
        rows = []
        for key, device, name, value in rec["device_samples"]:
            if name not in DEVICE_METRICS or not isinstance(value, int | float):
                continue
            self.recent.add(name, int(key), t, float(value))
            if math.isfinite(value):
                rows.append(Metric(time=t, cluster=self.cluster.name, job=self.job.name,
                                   node=node, rank=int(key), device=f"{node}/{str(device)[:24]}",
                                   name=name, value=float(value)))
        self.add_samples(rows)

    def _on_report(self, rec: dict[str, Any]) -> None:
        if "event" in rec:
            self._on_event(rec)
            return
        if "device_samples" in rec:
            self._on_samples(rec)
            return
        # Typed here: the port is open to any local process, and a string in an Integer column
        # would reach the page (a ValueError drops the datagram instead).
        r = Report(t=float(rec["t"]), rank=int(rec["rank"]), step=int(rec["step"]),
                   samples=_opt(int, rec.get("samples")), loss=_opt(float, rec.get("loss")),
                   total_steps=_opt(int, rec.get("total_steps")),
                   samples_total=_opt(int, rec.get("samples_total")))
        if isinstance(rec.get("pid"), int) and self.pids_here:
            self.telemetry.worker_pid(r.rank, rec["pid"])
            self.worker_pids[r.rank] = rec["pid"]
        self.last_seen[r.rank] = (time.time(), r.step)
        self.ever_reported = True
        if self.training_since is None:
            self.training_since = time.time()
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
        j.samples = self.samples_before + self.throughput.total_samples
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
        elif self.final_failure is not None and self.stop_reason is None:
            status, reason = "failed", self.final_failure
        elif self.stop_reason is not None and (code != 0 or self.exited_for_resize):
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


def elastic_plan(spec: JobSpec, workers: int) -> tuple[elastic.Policy | None, list[int], int]:
    """(policy, allowed sizes, first size) of an elastic job; (None, [n], n) otherwise."""
    bounds = spec.worker_range
    if bounds is None:
        return None, [workers], workers
    policy = elastic.Policy(bounds[0], bounds[1], spec.scale_up_util, spec.scale_down_util,
                            spec.cooldown_s)
    allowed = elastic.sizes(policy, lambda w: _fits(spec, w))
    return policy, allowed, max([w for w in allowed if w <= workers] or allowed[:1] or [workers])


def _fits(spec: JobSpec, workers: int) -> bool:
    try:
        spec.layout(workers)
    except ValueError:
        return False
    return True


def _opt(kind: type[int] | type[float], value: Any) -> Any:
    """`value` as `kind`, None kept; anything else (a string, a list) raises ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not a number: {value!r}")
    return kind(value)


def _loopback(address: str) -> bool:
    from gpufleet.backends.ray import is_loopback

    return is_loopback(address) if address else False


def _report_socket(host: str = "127.0.0.1") -> socket.socket:
    """The UDP socket workers report to, on a free port of `host`, with a large receive buffer
    so a burst of reports waits in the kernel while we write to the store."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((host, 0))
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
    from gpufleet.lifecycle import pools
    from gpufleet.store import Cluster as ClusterRow

    args = argv if argv is not None else sys.argv[1:]
    store = Store()
    job = jobs.get(store, args[0])
    with store.session() as s:
        cluster = s.get(ClusterRow, job.cluster_id)
    assert cluster is not None
    backend = pools.backend_for(pools.pool_of(store, cluster))
    done = Supervisor(store, job, cluster, backend).run()
    return 0 if done.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
