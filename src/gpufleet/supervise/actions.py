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
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.backends.alloc import Allocating
from gpufleet.backends.base import RunRequest
from gpufleet.errors import GpufleetError
from gpufleet.launch.torchrun import JobContext, worker_env
from gpufleet.lifecycle import clusters, engine_heal, jobs, leftovers
from gpufleet.reportauth import KEY_ENV
from gpufleet.store import Job
from gpufleet.supervise import durable, elastic, outcome
from gpufleet.supervise import events as ev
from gpufleet.supervise.logs import LogSink

if TYPE_CHECKING:
    from gpufleet.supervise.supervisor import Supervisor

class Effects:
    """The supervisor's hands: `do(action)` for each action `machine.step` returns."""

    def __init__(self, sup: Supervisor):
        self.sup = sup
        self.last_flush = self.last_tick = 0.0
        self.free_cache: tuple[float, int] | None = None

    def do(self, action: ev.Action) -> None:
        sup = self.sup
        match action:
            case ev.StartWorkers():
                self.start(action)
            case ev.EndWorkers(grace_s=grace):
                sup.end_workers(grace)
            case ev.Transition():
                jobs.transition(sup.store, sup.job.id, action.status, action.reason,
                                fields=dict(action.fields) or None)
                sup.job.status = action.status
                for key, value in action.fields.items():
                    setattr(sup.job, key, value)
            case ev.RecordEvent(kind=kind, text=text):
                jobs.add_event(sup.store, sup.job.id, kind, text)
            case ev.RequestWorkers():
                control = self.control_path()
                tmp = control.with_name("control.json.tmp")
                tmp.write_text(json.dumps({"seq": action.seq, "action": action.action}))
                os.replace(tmp, control)
            case ev.Resize():
                sup.follow_ups.append(self.resize(action))
            case ev.Heal():
                sup.follow_ups.append(self.heal())
            case ev.Wait(seconds=seconds):
                sup.backoff_until = time.monotonic() + seconds
            case ev.Say(text=text):
                sup.lines.say(f"gpufleet: {text}")
            case ev.NewLogRun(note=note):
                if sup.sink is not None:
                    sup.sink.new_run(note)
            case ev.Finish():
                pass  # the loop ends; `finish` records the outcome after the clean-up

    # -- a run of the workers -------------------------------------------------------------------
    def start(self, action: ev.StartWorkers) -> None:
        sup = self.sup
        assert sup.sink is not None and sup.sock is not None
        job_dir = Path(sup.job.job_dir)
        sup.intake.new_run()
        placements = clusters.placements(sup.store, sup.cluster)
        placement = dataclasses.replace(placements[0],
                                        devices=placements[0].devices[: action.workers])
        spec = sup.spec
        if sup.policy is not None:
            spec = spec.model_copy(update={"workers_per_node": action.workers})
        host, port = sup.sock.getsockname()[:2]
        ctx = JobContext(
            job_name=sup.job.name, cluster_name=sup.cluster.name, job_dir=job_dir,
            report_addr=f"{host}:{port}", fabric=sup.cluster.network, python=sys.executable,
            host_cpus=os.cpu_count() or 1,
        )
        survive = self.survive_env(job_dir, action)
        prepared = sup.backend.prepare(RunRequest(
            spec=spec, layout=spec.layout(action.workers), placements=placements,
            workers=action.workers, ctx=ctx, job_dir=job_dir,
            run_id=f"{sup.job.name}-{action.run}", survive_env=survive,
            cluster_name=sup.cluster.name, cluster_devices=sup.cluster.count,
            engine_ref=sup.cluster.engine_ref or ""))
        # who started the run: `reconcile` ends only this supervisor's leftovers, not a resumed run
        mine = leftovers.identity_env(sup.job.name, sup.job.job_dir, os.getpid())
        env = worker_env(os.environ, {**prepared.env, **survive, **mine}, spec.env)
        env[KEY_ENV] = sup.report_key  # after the user's env, and not in command.json
        for file_name, content in prepared.files.items():  # framework configs, a plan
            (job_dir / file_name).write_text(content)
        (job_dir / "command.json").write_text(json.dumps({"argv": prepared.argv,
                                                          "env": prepared.env}, indent=1))
        for stale in (self.control_path(), Path(f"{self.control_path()}.exited")):
            stale.unlink(missing_ok=True)  # requests to earlier workers (or an earlier supervisor)
        sup.sink.run_started(time.time())  # its error records are the files written after
        sup.handle = sup.backend.start(prepared, env, Path(spec.workdir or "."))
        sup.follow_ups.append(ev.WorkersStarted())
        sup.reader = threading.Thread(target=sup.read_output, args=(sup.handle, sup.sink),
                                      daemon=True)
        sup.reader.start()
        sup.telemetry.start(sup.handle, placement, env, sup.sink,
                            sample=sup.backend.capabilities.samples_devices)

    def survive_env(self, job_dir: Path, action: ev.StartWorkers) -> dict[str, str]:
        """Where checkpoints go and how the supervisor asks for one, for `train.Checkpointer`."""
        sup = self.sup
        env = {"GPUFLEET_CHECKPOINT_DIR": str(job_dir / "checkpoints"),
               "GPUFLEET_CONTROL_FILE": str(job_dir / "control.json"),
               "GPUFLEET_RUN": str(action.run)}
        if sup.spec.checkpoint_to:
            env["GPUFLEET_CHECKPOINT_TO"] = sup.spec.checkpoint_to
        if sup.policy is not None:
            env["GPUFLEET_GRAD_ACCUM"] = str(elastic.grad_accum(sup.policy, action.workers))
        return env

    def control_path(self) -> Path:
        return Path(self.sup.job.job_dir) / "control.json"

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
        sup = self.sup
        lost = sup.backend.lost_nodes(Path(sup.job.job_dir))
        if isinstance(sup.backend, Allocating):
            notes = self.reallocate(lost)
        else:
            nodes = [dataclasses.replace(n, healthy=False) if n.id in lost else n
                     for n in sup.backend.discover()]
            sup.cluster, notes = clusters.heal(sup.store, sup.cluster, nodes)
        if sup.spec.workers_per_node is None:
            workers = sup.cluster.count
        else:
            workers = sup.spec.workers_per_node * sup.cluster.nodes
        return ev.Healed(workers, tuple(notes))

    def reallocate(self, lost: set[str]) -> list[str]:
        """On an engine that allocates: the heal `engine_heal.reallocate` decides with it."""
        sup = self.sup
        if not isinstance(sup.backend, Allocating):
            return []
        sup.cluster, notes = engine_heal.reallocate(
            sup.store, sup.backend, sup.cluster, lost, lambda t: sup.lines.say(f"gpufleet: {t}"))
        return notes

    def resize(self, action: ev.Resize) -> ev.Resized:
        """Change the reservation of a cluster made for this job (a shared one: within it)."""
        sup = self.sup
        self.free_cache = None
        if sup.cluster.for_job != sup.job.name:
            return ev.Resized(action.target)
        try:
            sup.cluster = clusters.resize(sup.store, sup.cluster.id, action.target,
                                          sup.backend.discover())
        except GpufleetError as exc:
            return ev.Resized(action.before, blocked=str(exc))
        return ev.Resized(action.target)

    def free_devices(self) -> int:
        """Devices the job could grow by: its cluster's own idle ones, plus, for a cluster made
        for it, free ones of its type in the pool (looked up at most every 10 s)."""
        sup = self.sup
        idle = max(0, sup.cluster.count - sup.workers)
        if sup.cluster.for_job != sup.job.name:
            return idle  # a shared cluster: grow within it only
        now = time.monotonic()
        if self.free_cache is None or now - self.free_cache[0] > 10.0:
            self.free_cache = (now, clusters.free_count(sup.store, sup.cluster,
                                                        sup.backend.discover()))
        return idle + self.free_cache[1]

    # -- the end --------------------------------------------------------------------------------
    def finish(self, sink: LogSink | None) -> Job:
        """Record the final status (unless it is final already), free a cluster made for the
        job, close the logs; the job as stored."""
        sup = self.sup
        state = sup.state
        overall = sup.intake.throughput.overall_samples_per_s()
        fields: dict[str, object] = {"exit_code": state.exit_code}
        if overall is not None:
            fields["samples_per_s"] = overall
        # `gpufleet stop` leaves its reason on the row before it signals us
        asked = jobs.get(sup.store, sup.job.name).reason if state.stop_reason is not None \
            else None
        tail = None if sink is None else sink.failure(sup.cluster.nodes == 1)
        status, reason = outcome.final(state.ending, asked, jobs.STOP_REQUESTED, tail)
        copy = durable.state((e.kind, e.reason) for e in jobs.events(sup.store, sup.job.id))
        if copy is not None and copy.behind:  # the last word of the history, next to the status
            jobs.add_event(sup.store, sup.job.id, durable.CopyEvent.BEHIND,
                           f"the job ended with the durable copy at {copy.text}")
        jobs.transition(sup.store, sup.job.id, status, reason, fields=fields)  # unless final
        sup.job = jobs.get(sup.store, sup.job.name)
        if sup.cluster.for_job == sup.job.name and not sup.spec.keep:
            sup.cluster = clusters.stop(sup.store, sup.cluster.name,
                                        reason=f"job {sup.job.name} ended",
                                        cluster_id=sup.cluster.id)
        if sink is not None:
            sink.close()
        return jobs.get(sup.store, sup.job.name)

