"""The supervisor's telemetry duties: sample devices once a second, diagnose every few seconds,
downsample old samples every minute.

Kept apart from the supervisor's process handling: it reads the job's `RunState` (the job,
its cluster, spec, store, recent samples; the intake that takes its samples) and is handed the
machine's state where a diagnosis needs it, and changes neither.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from gpufleet import catalog
from gpufleet.backends.local import cpu_slot_count
from gpufleet.pool.model import Placement
from gpufleet.store import Metric, retention
from gpufleet.supervise.goodput import Verdict
from gpufleet.supervise.view import seconds_per_step
from gpufleet.telemetry import records
from gpufleet.telemetry.collect import CpuSampler, NvmlSampler
from gpufleet.telemetry.diagnose import Inputs, Thresholds, diagnose
from gpufleet.telemetry.findings import ResizeVerdict
from gpufleet.telemetry.schema import DEVICE_METRICS

if TYPE_CHECKING:
    from gpufleet.backends.base import Handle
    from gpufleet.supervise.logs import LogSink
    from gpufleet.supervise.run_state import RunState
    from gpufleet.supervise.state import State

ENABLED_ENV = "GPUFLEET_TELEMETRY"


class TelemetryState:
    def __init__(self, run: RunState):
        self.run = run
        self.enabled = os.environ.get(ENABLED_ENV, "1") != "0"
        self.cpu: CpuSampler | None = None
        self.nvml: NvmlSampler | None = None
        self.handle: Handle | None = None
        self.sink: LogSink | None = None
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()
        self.last_diagnosis = self.last_compaction = time.time()
        self.baseline: float | None = None
        self.blamed_rank: int | None = None  # set when a failed run ends (supervisor._exited)
        self.failed = False
        self.thresholds = thresholds_from_env(os.environ)

    def start(self, handle: Handle, placement: Placement, env: dict[str, str],
              sink: LogSink, sample: bool = True) -> None:
        """Start sampling. Called with the workers already running, so nothing here may raise:
        a failure is written to the job folder and the job goes on without device telemetry.
        `sample=False`: the nodes' own agents sample their devices (a Ray pool)."""
        self.handle, self.sink = handle, sink
        self.stopping = threading.Event()  # a fresh one per run of the workers
        self.cpu = self.nvml = None
        run = self.run
        try:
            self.baseline = records.baseline_samples_per_s(run.store, run.job, run.cluster.gpu)
            if self.enabled and sample:
                self._start_sampler(placement, env)
        except Exception:
            self._failed()

    def _start_sampler(self, placement: Placement, env: dict[str, str]) -> None:
        devices = list(placement.devices)
        ids = [d.id for d in devices]
        if all(d.gpu == "cpu" for d in devices):
            per_slot = psutil.virtual_memory().total // cpu_slot_count()
            self.cpu = CpuSampler(ids, threads_of(env), per_slot)
        else:
            try:
                self.nvml = NvmlSampler([d.index for d in devices], ids)
            except Exception:  # no NVML after all: reports still flow, devices go unmeasured
                self.nvml = None
        self.thread = threading.Thread(target=self._sample_loop, daemon=True,
                                       name="gpufleet-telemetry")
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        if self.nvml is not None:
            self.nvml.close()

    def worker_pid(self, rank: int, pid: int) -> None:
        if self.cpu is not None:
            self.cpu.pids[rank] = pid

    def _sample_loop(self) -> None:
        while not self.stopping.wait(_until_next_second()):
            try:
                self._sample(time.time())
            except Exception:  # telemetry must never take the job down
                continue

    def _sample(self, now: float) -> None:
        run = self.run
        samples = []
        if self.cpu is not None and self.handle is not None:
            self.cpu.find(self.handle.pid)
            samples = self.cpu.sample()
        elif self.nvml is not None:
            samples = self.nvml.sample()
        rows = [Metric(time=now, cluster=run.cluster.name, job=run.job.name, node="local",
                       rank=s.key, device=s.device, name=s.name, value=s.value) for s in samples]
        for s in samples:
            run.recent.add(s.name, s.key, now, s.value)
        run.intake.add_samples(rows)

    def tick(self, now: float, state: State) -> None:
        """Called from the supervisor's loop. A failure here is written to the job folder once
        and the job goes on: telemetry must never take a training run down."""
        try:
            if now - self.last_diagnosis >= DIAGNOSE_EVERY_S:
                self.last_diagnosis = now
                self.diagnose(now, state)
            if now - self.last_compaction >= COMPACT_EVERY_S:
                self.last_compaction = now
                retention.compact(self.run.store, self.run.job.name, now)
        except Exception:
            self._failed()

    def _failed(self) -> None:
        """Keep the first telemetry failure's traceback in the job folder (later ones are
        usually its echo)."""
        if not self.failed:
            self.failed = True
            with contextlib.suppress(OSError):
                (Path(self.run.job.job_dir) / "telemetry-error.log").write_text(
                    traceback.format_exc())

    def inputs(self, now: float, state: State, final: bool = False) -> Inputs:
        """What a diagnosis reads: the job's records and recent samples, and from the machine's
        `state` the exit code (of the final diagnosis) and the resizes judged so far."""
        run = self.run
        job, cluster = run.job, run.cluster
        snap = run.recent.snapshot(now)
        gpu = catalog.gpu_types().get(cluster.gpu)
        layout: Any = None
        with contextlib.suppress(ValueError, TypeError):
            layout = run.spec.layout(job.world_size)
        return Inputs(
            now=now, status="ended" if final else job.status, started_at=job.started_at,
            last_report_at=job.last_report_at, step=job.step,
            seconds_per_step=seconds_per_step(job), world_size=job.world_size,
            on_gpu=cluster.gpu != "cpu" and not cluster.simulated, gpu=cluster.gpu,
            gpu_bf16=bool(gpu and gpu.bf16),
            precision=layout.precision if layout else run.spec.precision,
            strategy=run.spec.strategy,
            ranks={k: v for k, v in snap.items() if k not in DEVICE_METRICS},
            devices={k: v for k, v in snap.items() if k in DEVICE_METRICS},
            log_tail=tuple(self._log_tail()), samples_per_s=job.samples_per_s,
            baseline_samples_per_s=self.baseline, reports_expected=run.intake.reports_expected,
            job=job.name, failed_rank=self.blamed_rank,
            exit_code=state.exit_code if final else None,
            resizes=tuple(ResizeVerdict(j.before.workers, j.after.workers,
                                        j.verdict is Verdict.REVERTED, j.text, j.trigger)
                          for j in state.judged),
        )

    def diagnose(self, now: float, state: State, final: bool = False) -> None:
        found = diagnose(self.inputs(now, state, final), self.thresholds)
        records.save_findings(self.run.store, self.run.job.id, found, now, final)

    def _log_tail(self) -> list[str]:
        if self.sink is None:
            return []
        lines: list[str] = []
        for rank, tail in list(self.sink.tails.items()):
            for _ in range(3):  # the reader thread may append while we copy
                try:
                    copied = list(tail)
                    break
                except RuntimeError:
                    copied = []
            prefix = f"[rank {rank}] " if rank is not None else ""
            lines += [prefix + ln for ln in copied]
        return lines


def threads_of(env: dict[str, str]) -> int:
    """Threads per worker from OMP_NUM_THREADS, which may be a nested list ("4,2": the first
    level is the worker's); 1 when unset or unreadable."""
    first = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else 1


def thresholds_from_env(env: dict[str, str] | os._Environ[str]) -> Thresholds:
    """$GPUFLEET_STALL_AFTER_S: how long without a step before a running job counts as
    stalled (default 120 s, or ten step times if longer), for jobs with long quiet phases."""
    raw = env.get("GPUFLEET_STALL_AFTER_S", "")
    try:
        value = float(raw)
    except ValueError:
        return Thresholds()
    return Thresholds(stall_min_s=value, startup_s=max(value, Thresholds().startup_s)) \
        if value > 0 else Thresholds()


DIAGNOSE_EVERY_S = 5.0
COMPACT_EVERY_S = 60.0


def _until_next_second() -> float:
    """Sample on whole seconds, so every device's samples share timestamps."""
    return 1.0 - (time.time() % 1.0)
