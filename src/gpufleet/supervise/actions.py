"""The machine's actions carried out: store writes, starting and ending processes, the control
file, the terminal. Each is plain I/O with no decision in it; an action whose I/O has a result
the machine needs (a start, a heal, a resize) queues the event that reports it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet import durable_copy
from gpufleet.backends.alloc import Allocating
from gpufleet.backends.base import RunRequest
from gpufleet.errors import GpufleetError
from gpufleet.launch import run_env, warm_restart
from gpufleet.launch.torchrun import JobContext
from gpufleet.lifecycle import clusters, engine_heal, jobs, spares
from gpufleet.store import Job
from gpufleet.supervise import elastic, outcome
from gpufleet.supervise import events as ev
from gpufleet.supervise.logs import LogSink, pump
from gpufleet.supervise.run_state import RunState
from gpufleet.supervise.state import State
from gpufleet.supervise.telemetry import TelemetryState

ASKED_END_S = 5.0  # a waiting launcher told to end gets this long before it is killed


class Effects:
    """The supervisor's hands: `do(action)` for each action `machine.step` returns. It changes
    the job's `RunState` (never the supervisor), starts and stops `telemetry` with each run of
    the workers, and asks `stopping` whether the job is being stopped (the output reader stops
    echoing lines then)."""

    def __init__(self, run: RunState, telemetry: TelemetryState, stopping: Callable[[], bool]):
        self.run, self.telemetry, self.stopping = run, telemetry, stopping
        self.last_flush = self.last_tick = 0.0
        self.free_cache: tuple[float, int] | None = None

    def do(self, action: ev.Action) -> None:
        run = self.run
        match action:
            case ev.StartWorkers():
                self.start(action)
            case ev.EndWorkers(grace_s=grace):
                self.end_workers(grace)
            case ev.Transition():
                jobs.transition(run.store, run.job.id, action.status, action.reason,
                                fields=dict(action.fields) or None)
                run.job_moved(action.status, action.fields)
            case ev.RecordEvent(kind=kind, text=text):
                jobs.add_event(run.store, run.job.id, kind, text)
            case ev.RequestWorkers():
                control = self.control_path()
                tmp = control.with_name("control.json.tmp")
                tmp.write_text(json.dumps({"seq": action.seq, "action": action.action}))
                os.replace(tmp, control)
            case ev.Resize():
                run.then(self.resize(action))
            case ev.Heal():
                run.then(self.heal())
            case ev.Wait(seconds=seconds):
                run.back_off_until(time.monotonic() + seconds)
            case ev.Say(text=text):
                run.lines.say(f"gpufleet: {text}")
            case ev.NewLogRun(note=note):
                if run.sink is not None:
                    run.sink.new_run(note)
            case ev.Finish():
                pass  # the loop ends; `finish` records the outcome after the clean-up

    # -- a run of the workers -------------------------------------------------------------------
    def start(self, action: ev.StartWorkers) -> None:
        run = self.run
        assert run.sink is not None and run.sock is not None
        job_dir = Path(run.job.job_dir)
        run.intake.new_run()
        placements = clusters.placements(run.store, run.cluster)
        placement = dataclasses.replace(placements[0],
                                        devices=placements[0].devices[: action.workers])
        spec = run.spec
        if run.policy is not None:
            spec = spec.model_copy(update={"workers_per_node": action.workers})
        host, port = run.sock.getsockname()[:2]
        ctx = JobContext(
            job_name=run.job.name, cluster_name=run.cluster.name, job_dir=job_dir,
            report_addr=f"{host}:{port}", fabric=run.cluster.network, python=sys.executable,
            host_cpus=os.cpu_count() or 1,
        )
        survive = run_env.survive_env(
            job_dir, action.run, spec.checkpoint_to,
            None if run.policy is None else elastic.grad_accum(run.policy, action.workers))
        prepared = run.backend.prepare(RunRequest(
            spec=spec, layout=spec.layout(action.workers), placements=placements,
            workers=action.workers, ctx=ctx, job_dir=job_dir,
            run_id=f"{run.job.name}-{action.run}", survive_env=survive,
            cluster_name=run.cluster.name, cluster_devices=run.cluster.count,
            engine_ref=run.cluster.engine_ref or "",
            spares=clusters.spares(run.store, run.cluster), spared=spares.wanted(run.cluster) > 0))
        # who started the run: `reconcile` ends only this supervisor's leftovers, not a resumed run
        mine = run_env.identity_env(run.job.name, run.job.job_dir, os.getpid())
        env = run_env.workers_env(os.environ, prepared.env, survive, mine, spec.env,
                                  run.report_key)
        for file_name, content in prepared.files.items():  # framework configs, a plan
            (job_dir / file_name).write_text(content)
        (job_dir / "command.json").write_text(json.dumps({"argv": prepared.argv,
                                                          "env": prepared.env}, indent=1))
        for stale in (self.control_path(), Path(f"{self.control_path()}.exited")):
            stale.unlink(missing_ok=True)  # requests to earlier workers (or an earlier supervisor)
        restart_file = prepared.env.get(warm_restart.RESTART_FILE_VAR)
        # the launcher's command, and what else a restart in place needs the same
        launched = [*prepared.argv, prepared.shape]
        if self.restart_in_place(action.run, launched, env):
            run.sink.run_started(time.time())
            run.then(ev.WorkersStarted())
            assert run.handle is not None
            self.telemetry.start(run.handle, placement, env, run.sink,
                                 sample=run.backend.capabilities.samples_devices)
            return
        if restart_file:  # an earlier supervisor's decision is not this launcher's
            Path(restart_file).unlink(missing_ok=True)
        run.sink.run_started(time.time())  # its error records are the files written after
        handle = run.backend.start(prepared, env, Path(spec.workdir or "."))
        assert handle.stdout is not None
        reader = threading.Thread(target=pump, args=(handle.stdout, run.sink, run.lines,
                                                     self.stopping, run.launcher_parked),
                                  daemon=True)
        run.workers_started(handle, reader, (launched, env), restart_file)
        run.then(ev.WorkersStarted())
        reader.start()
        self.telemetry.start(handle, placement, env, run.sink,
                             sample=run.backend.capabilities.samples_devices)

    def restart_in_place(self, number: int, argv: list[str], env: dict[str, str]) -> bool:
        """Hand run `number` to the launcher that waits with its workers ended, when it can
        take it: the same command (the same size and shape), still alive. A launcher that
        cannot is ended here, and the caller starts a fresh one."""
        run = self.run
        if run.handle is None:
            return False
        if run.parked is None or run.launched is None or run.restart_file is None or \
                run.launched[0] != argv or run.backend.poll(run.handle) is not None:
            self.end_workers(10.0)
            return False
        warm_restart.write(Path(run.restart_file), number,
                           warm_restart.env_change(run.launched[1], env))
        run.restarted_in_place()
        return True

    def end_workers(self, grace_s: float, over: bool = False) -> None:
        """Stop sampling and end this run's process tree (a stopped process too: SIGKILL
        reaches it where SIGTERM waits for a SIGCONT); `over`: the job ends with it, which a
        launcher waiting for a decision is told (its nodes let the job's copies go)."""
        run = self.run
        self.telemetry.stop()
        handle = run.handle
        if handle is not None and run.parked is not None and run.restart_file is not None:
            # a launcher waiting with its workers ended ends by itself when told to
            warm_restart.write_end(Path(run.restart_file), run.parked, over)
            deadline = time.monotonic() + ASKED_END_S
            while run.backend.poll(handle) is None and time.monotonic() < deadline:
                time.sleep(0.02)
        if handle is not None and run.backend.poll(handle) is None:
            run.backend.kill_tree(handle, grace_s=grace_s)
        run.backend.end_orphans()
        if run.reader is not None:
            run.reader.join(timeout=5)
        run.workers_ended()

    def control_path(self) -> Path:
        return Path(self.run.job.job_dir) / "control.json"

    def acknowledged(self) -> int | None:
        """The request number the workers' file says they exited for (in case the datagram
        was lost); None without one."""
        try:
            return int(Path(f"{self.control_path()}.exited").read_text())
        except (OSError, ValueError):
            return None

    # -- reshaping the cluster ------------------------------------------------------------------
    def heal(self) -> ev.Healed:
        """Replace the nodes the backend says were lost (or unhealthy), or go on without them."""
        run = self.run
        lost = run.backend.lost_nodes(Path(run.job.job_dir))
        if isinstance(run.backend, Allocating):
            notes = self.reallocate(lost)
        else:
            nodes = [dataclasses.replace(n, healthy=False) if n.id in lost else n
                     for n in run.backend.discover()]
            healed, notes = spares.heal(run.store, run.cluster, nodes)
            run.cluster_changed(healed)
        if run.spec.workers_per_node is None:
            workers = run.cluster.count
        else:
            workers = run.spec.workers_per_node * run.cluster.nodes
        return ev.Healed(workers, tuple(notes))

    def reallocate(self, lost: set[str]) -> list[str]:
        """On an engine that allocates: the heal `engine_heal.reallocate` decides with it."""
        run = self.run
        if not isinstance(run.backend, Allocating):
            return []
        cluster, notes = engine_heal.reallocate(
            run.store, run.backend, run.cluster, lost, lambda t: run.lines.say(f"gpufleet: {t}"))
        run.cluster_changed(cluster)
        return notes

    def resize(self, action: ev.Resize) -> ev.Resized:
        """Change the reservation of a cluster made for this job (a shared one: within it)."""
        run = self.run
        self.free_cache = None
        if run.cluster.for_job != run.job.name:
            return ev.Resized(action.target)
        try:
            run.cluster_changed(clusters.resize(run.store, run.cluster.id, action.target,
                                                run.backend.discover()))
        except GpufleetError as exc:
            return ev.Resized(action.before, blocked=str(exc))
        return ev.Resized(action.target)

    def free_devices(self, workers: int) -> int:
        """Devices the job could grow from `workers` by: its cluster's own idle ones, plus, for
        a cluster made for it, free ones of its type in the pool (looked up at most every 10 s)."""
        run = self.run
        idle = max(0, run.cluster.count - workers)
        if run.cluster.for_job != run.job.name:
            return idle  # a shared cluster: grow within it only
        now = time.monotonic()
        if self.free_cache is None or now - self.free_cache[0] > 10.0:
            self.free_cache = (now, clusters.free_count(run.store, run.cluster,
                                                        run.backend.discover()))
        return idle + self.free_cache[1]

    # -- the end --------------------------------------------------------------------------------
    def finish(self, state: State, sink: LogSink | None) -> Job:
        """Record the final status (unless it is final already) from the machine's last
        `state`, free a cluster made for the job, close the logs; the job as stored."""
        run = self.run
        overall = run.intake.throughput.overall_samples_per_s()
        fields: dict[str, object] = {"exit_code": state.exit_code}
        if overall is not None:
            fields["samples_per_s"] = overall
        # `gpufleet stop` leaves its reason on the row before it signals us
        asked = jobs.get(run.store, run.job.name).reason if state.stop_reason is not None \
            else None
        tail = None if sink is None else sink.failure(run.cluster.nodes == 1)
        status, reason = outcome.final(state.ending, asked, jobs.STOP_REQUESTED, tail)
        copy = durable_copy.state((e.kind, e.reason) for e in jobs.events(run.store, run.job.id))
        if copy is not None and copy.behind:  # the last word of the history, next to the status
            jobs.add_event(run.store, run.job.id, durable_copy.CopyEvent.BEHIND,
                           f"the job ended with the durable copy at {copy.text}")
        jobs.transition(run.store, run.job.id, status, reason, fields=fields)  # unless final
        run.job_recorded(jobs.get(run.store, run.job.name))
        if run.cluster.for_job == run.job.name and not run.spec.keep:
            run.cluster_changed(clusters.stop(run.store, run.cluster.name,
                                              reason=f"job {run.job.name} ended",
                                              cluster_id=run.cluster.id))
        if sink is not None:
            sink.close()
        return jobs.get(run.store, run.job.name)

