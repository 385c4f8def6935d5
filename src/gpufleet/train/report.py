"""Progress reports from workers to the supervisor, off the training hot path.

Each call sends one small JSON datagram over UDP to $GPUFLEET_REPORT_ADDR with a non-blocking
socket: the kernel queues it and training goes on. If the supervisor is gone or slow, the datagram
is dropped and training is not slowed: losing a progress line is better than stalling a step.

Each datagram is signed with the job's key from $GPUFLEET_REPORT_KEY (see gpufleet.reportauth):
the supervisor drops what anyone else on the machine sends to its port. Without a key (bare
torchrun, a script run by hand) nothing is sent: no supervisor would accept it.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from gpufleet.reportauth import signer_from_env
from gpufleet.telemetry import wire
from gpufleet.train import telemetry


class _Reporter:
    def __init__(self) -> None:
        self.addr: tuple[str, int] | None = None
        self.sock: socket.socket | None = None
        self.rank = int(os.environ.get("RANK", "0"))
        self.samples_total = 0
        self.pid = os.getpid()  # lets the supervisor find this rank's process for CPU telemetry
        self.node = os.environ.get(wire.NODE_ENV) or None  # set per node on Ray and Slurm
        self.signer = signer_from_env(os.environ)
        raw = os.environ.get("GPUFLEET_REPORT_ADDR", "")
        host, _, port = raw.rpartition(":")
        if host and port.isdigit() and self.signer is not None:
            self.addr = (host, int(port))
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.setblocking(False)

    def send(self, record: dict[str, Any]) -> None:
        if self.sock is None or self.addr is None or self.signer is None:
            return
        data = wire.encode(record)
        if data is None:
            return
        data = self.signer.seal(data)
        try:
            self.sock.sendto(data, self.addr)
        except OSError:
            pass  # supervisor gone or buffer full: drop, never block training


class _Sdk:
    """Whether this process uses the SDK (`prepare` or `report`): the worker bootstrap then
    stops reporting optimizer steps, since the script's own reports are better."""

    used = False


SDK = _Sdk()
_reporter: _Reporter | None = None


def report(step: int, *, loss: float | None = None, samples: int | None = None,
           total_steps: int | None = None, **metrics: float) -> None:
    """Tell the supervisor where training is.

    step: the step just finished (1-based). samples: samples the whole job consumed in this step
    (the global batch); the supervisor reads throughput from rank 0's reports. total_steps: the
    planned number of steps, for the ETA. Extra keyword metrics are numbers, e.g.
    `step_time_seconds=0.12`. Without a supervisor (bare torchrun) this does nothing.

    Step time, time waiting for data and communication time are added for you (see
    train/telemetry.py) unless you pass them; a script that reports every Nth step still gets
    per-step figures.

    Pass Python numbers: a CUDA tensor would make this call wait for the GPU (`float()` syncs),
    so take `loss.item()` only on the steps you report the loss, as examples/gpt.py does.
    """
    SDK.used = True
    progress(step, loss=loss, samples=samples, total_steps=total_steps, metrics=metrics)


def progress(step: int, *, loss: float | None = None, samples: int | None = None,
             total_steps: int | None = None, source: str | None = None,
             metrics: dict[str, float] | None = None) -> None:
    """`report` without marking the SDK as used: the worker bootstrap's reports
    (`source="bootstrap"`, which the supervisor reads as steps counted from outside)."""
    global _reporter
    if _reporter is None:
        _reporter = _Reporter()
    if _reporter.sock is None:
        return
    measured = telemetry.COUNTERS.take(int(step)) if telemetry.ENABLED else {}
    if samples is not None:
        _reporter.samples_total += int(samples)
    _reporter.send(wire.progress_record(
        t=time.time(), rank=_reporter.rank, pid=_reporter.pid, step=step, node=_reporter.node,
        source=source, loss=loss, samples=samples,
        samples_total=_reporter.samples_total if samples is not None else None,
        total_steps=total_steps, metrics={**measured, **(metrics or {})}))


def send_event(kind: str, **fields: Any) -> None:
    """A lifecycle note for the supervisor (a checkpoint saved, a resume, a skipped checkpoint),
    which records it as a job event. Fire and forget, like `report`."""
    global _reporter
    if _reporter is None:
        _reporter = _Reporter()
    _reporter.send(wire.note_record(kind, t=time.time(), rank=_reporter.rank, pid=_reporter.pid,
                                    node=_reporter.node, fields=fields))


def send_launcher_note(kind: str, **fields: Any) -> None:
    """A note from a node's launcher (launch/warm.py's fallback to cold starts): no rank, no
    pid. Fire and forget, like `report`."""
    _Reporter().send(wire.note_record(kind, t=time.time(), rank=-1, pid=None,
                                      node=os.environ.get(wire.NODE_ENV) or None, fields=fields))
