"""Ending what is left of a job whose supervisor died: the processes of its last run.

The keeper (backends/keeper.py) ends a run's tree when its supervisor dies. This is the second
line, for when the kill took the keeper out too (kill -9 of the whole tree but a worker, an OOM
kill of both): whoever reconciles the job next ends every process of ours that still carries the
run's identity in its environment (`launch.run_env.identity_env`). A keeper still alive is doing
that itself, and its last part, the `--after` clean-up, removes a job's container: a reconcile
within seconds of the supervisor's death waits for such a keeper (`backends.proc_tree`'s bound)
instead of signalling it and its tree, which left the container listed as running for good.
Each process of a run has the identity, because the supervisor passes it to the keeper and
everything below inherits it: the job's folder and name, and the pid of the supervisor that
started the run, so a later run of the same job (`run --resume`, under a new supervisor) is
never mistaken for the dead one's leftovers.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

from gpufleet.backends.proc_tree import KEEPER_ENDS_S
from gpufleet.launch.run_env import SUPERVISOR_VAR

GRACE_S = 3.0  # SIGTERM, then SIGKILL this many seconds later
KEEPER_SCRIPT = "backends/keeper.py"  # how a keeper's command line names it (keeper.spawn)


@dataclass(frozen=True)
class RunIdentity:
    """What every process of one run of a job has in its environment."""

    job_name: str
    job_dir: str
    supervisor_pid: int


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    uid: int
    environ: Mapping[str, str]


def belongs(environ: Mapping[str, str], run: RunIdentity) -> bool:
    return (environ.get("GPUFLEET_JOB_DIR") == run.job_dir
            and environ.get("GPUFLEET_JOB") == run.job_name
            and environ.get(SUPERVISOR_VAR) == str(run.supervisor_pid))


def of_run(procs: Iterable[ProcessInfo], run: RunIdentity, uid: int, me: int) -> list[int]:
    """The pids among `procs` that are the run's: same user, its identity, and never the
    caller itself (a `gpufleet` command started from a job's own shell inherits it)."""
    return sorted(p.pid for p in procs if p.uid == uid and p.pid != me and belongs(p.environ, run))


def _scan() -> list[ProcessInfo]:
    found = []
    for p in psutil.process_iter(["pid", "uids"]):
        try:
            found.append(ProcessInfo(p.pid, p.info["uids"].real, p.environ()))
        except (psutil.Error, AttributeError):
            continue  # gone, a zombie, or not ours to read
    return found


def _still_ours(proc: psutil.Process, run: RunIdentity) -> bool:
    """Read again just before a signal: the pid may have been reused since the scan."""
    try:
        return belongs(proc.environ(), run)
    except psutil.Error:
        return False


def _send(procs: list[psutil.Process], run: RunIdentity, sig: int) -> None:
    for p in procs:
        if _still_ours(p, run):
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass


def _living(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of `procs` still running after up to `timeout_s`. A zombie counts as ended: these
    are not our children, and whoever adopted them may be slow to reap them."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                continue
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _processes(pids: Iterable[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return procs


def _is_keeper(proc: psutil.Process) -> bool:
    try:
        return any(arg.endswith(KEEPER_SCRIPT) for arg in proc.cmdline()[:4])
    except psutil.Error:
        return False


def end_run(run: RunIdentity, grace_s: float = GRACE_S,
            keeper_s: float = KEEPER_ENDS_S) -> list[int]:
    """Let a live keeper of the run end its tree and clean up (up to `keeper_s`), then SIGTERM
    every live process of the run, SIGKILL those left after `grace_s`; their pids."""
    pids = of_run(_scan(), run, os.getuid(), os.getpid())
    keepers = [p for p in _processes(pids) if _is_keeper(p)]
    if keepers:
        _living(keepers, keeper_s)
        pids = sorted(set(pids) | set(of_run(_scan(), run, os.getuid(), os.getpid())))
    procs = _processes(pids)
    if not procs:
        return pids
    _send(procs, run, signal.SIGTERM)
    alive = _living(procs, grace_s)
    _send(alive, run, signal.SIGKILL)
    _living(alive, 5.0)
    return pids
