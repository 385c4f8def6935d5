"""The server's heartbeat: every second, notice dead supervisors (and free their devices), start
what the queue says may start, and book the ledger; for a local server, exit when idle.

A supervisor is a process on this host; its liveness is its pid with its start time
(`reconcile.supervisor_alive`), so a `kill -9` is seen at the next beat. Supervisors the server
started are its children: each beat collects the ended ones (`runs.reap`), so none lingers as a
zombie for the server's lifetime.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select

from gpufleet.lifecycle import dispatch, jobs, ledger, reconcile, runs
from gpufleet.status import QueueStatus
from gpufleet.store import Job, QueuedJob, Store

BEAT_S = 1.0
# the least time from one beat's start to the next: every submit and cancel wakes the loop, and
# under a stream of them it would plan the queue back to back, taking the store's write lock and
# the CPU from the requests it serves
MIN_GAP_S = 0.2
LEDGER_EVERY_S = 5.0
BROKEN_AFTER = 30  # failed beats in a row after which a local server gives up


@dataclass
class Beat:
    """What the last beat saw (for /api/v1/health and the tests)."""

    at: float = 0.0
    queued: int = 0
    active: int = 0
    started: list[str] = field(default_factory=list)
    error: str | None = None


class Loop:
    """Runs `beat` in a thread until stopped; `idle_exit_s`: call `on_idle` once nothing has
    been queued or running for that long (a local server's exit)."""

    def __init__(self, store: Store, idle_exit_s: float | None = None,
                 on_idle: Callable[[bool], bool] | None = None):
        self.store = store
        self.idle_exit_s = idle_exit_s
        # on_idle(broken): end the server if it may (nothing arrived meanwhile, or `broken`);
        # True when it is ending, so the loop ends too
        self.on_idle = on_idle
        self.failures = 0  # beats in a row that failed
        self.last = Beat()
        self.busy_at = time.time()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_ledger = 0.0
        self.thread = threading.Thread(target=self._run, name="gpufleet-loop", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def wake(self) -> None:
        """Beat now (a job was submitted or cancelled), not at the next second."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.beat(time.time())
            self._wake.wait(BEAT_S)
            self._wake.clear()
            self._stop.wait(MIN_GAP_S - (time.monotonic() - started))  # a wake then: next beat

    def beat(self, now: float) -> Beat:
        b = Beat(at=now)
        try:
            runs.reap()
            reconcile.reconcile(self.store)
            b.started = dispatch.dispatch(self.store, now).started
            if now - self._last_ledger >= LEDGER_EVERY_S or b.started:
                ledger.accrue(self.store, now)
                self._last_ledger = now
            with self.store.read() as s:
                b.queued = len(s.scalars(select(QueuedJob.id).where(
                    QueuedJob.status == QueueStatus.QUEUED)).all())
                b.active = len(s.scalars(select(Job.id).where(Job.status.in_(jobs.ACTIVE))).all())
        except Exception as exc:  # one bad beat must not end the server; the next one retries
            b.error = f"{type(exc).__name__}: {exc}"
            if b.error != self.last.error:  # the same failure every second is told once
                traceback.print_exc(file=sys.stderr)
        self.failures = self.failures + 1 if b.error else 0
        self.last = b
        if b.queued or b.active:
            self.busy_at = now
        if self.idle_exit_s is None or self.on_idle is None:
            return b
        # a local server ends when idle, or when it cannot work at all (its state folder gone):
        # the next command that needs one starts a new one, which says why if it cannot either
        broken = self.failures >= BROKEN_AFTER
        idle = not b.error and now - self.busy_at >= self.idle_exit_s
        if (broken or idle) and self.on_idle(broken):
            self._stop.set()
        return b
