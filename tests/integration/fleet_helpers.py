"""Helpers for the integration tests: the real `gpufleet` CLI, run as a subprocess.

A `Fleet` is the CLI bound to one state folder ($GPUFLEET_HOME under tmp_path) and a fixed number
of CPU slots, so tests never see each other's clusters. `Fleet.cleanup` stops every cluster of
that home and returns any process started under it (supervisor, torchrun, workers) that is still
alive: every process the CLI starts inherits $GPUFLEET_HOME, which is how we find them, and why
tests never match processes by name alone (another session may run the same scripts).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
WORKERS = Path(__file__).resolve().parent / "workers"
CLI = [sys.executable, "-m", "gpufleet.cli"]
DEFAULT_TIMEOUT = 120  # a cold CLI call on a machine loaded many times over; a wait, not a verdict
CLI_EVERY_S = 5.0  # how often a wait asks the CLI even when the state file says nothing new
ACTIVE = ("starting", "running", "restarting", "resizing")
# how long a wait goes on once the job has ended without what it waits for: the rows written
# after the end (events, costs) are in by then, and a `resume` has made it active again
ENDED_GRACE_S = 60.0
ENDED = ("succeeded", "failed", "stopped", "interrupted", "cancelled", "refused")  # job or queue
WARM_MARK = "multiprocessing.forkserver"  # a warm job's forkserver and its forks (launch/warm.py)


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def leftovers(home: Path, marker: str | None = None) -> list[psutil.Process]:
    """Live processes started under `home` (by $GPUFLEET_HOME), optionally only those whose
    command line contains `marker` (e.g. a worker script). A warm job's forkserver and the
    workers forked from it carry no script in their command line: they always count."""
    found = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if marker is not None and marker not in cmd and WARM_MARK not in cmd:
                continue
            if p.environ().get("GPUFLEET_HOME") == str(home):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_no_leftovers(home: Path, marker: str | None = None, timeout: float = 10.0) -> list[str]:
    """Wait until no process of `home` (matching `marker`) is left; return the command lines of
    those still alive after `timeout` (empty when all are gone)."""
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(home, marker)
        if not left or time.monotonic() > deadline:
            out = []
            for p in left:
                try:
                    out.append(f"{p.pid}: {' '.join(p.cmdline())}")
                except psutil.Error:
                    pass
            return out
        time.sleep(0.2)


WARM_ALL = "GPUFLEET_TEST_WARM"  # "0": every `run` of the tests starts its workers plain


def rank_pid(home: Path, rank: int, script: str, timeout: float = 30.0) -> int:
    """The pid of this home's `script` worker with RANK=`rank`, waiting up to `timeout` for it.
    A warm rank (forked: the forkserver's command line and environment) is found by the name
    it gives its process (launch/warm_rank.py)."""
    from gpufleet.launch.warm_rank import rank_in_name

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline", "name"]):
            try:
                warm = rank_in_name(p.info["name"] or "", "RANK")
                if warm is not None or script in " ".join(p.info["cmdline"] or []):
                    env = p.environ()
                    if env.get("GPUFLEET_HOME") == str(home) and \
                            (warm or env.get("RANK")) == str(rank):
                        return p.pid
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} process of {script} under {home}")


def warm_if_asked(args: tuple[str, ...]) -> tuple[str, ...]:
    """`run ARGS` as `run --no-warm ARGS` when $GPUFLEET_TEST_WARM=0 and the test chose neither
    (docs/testing.md: the suite run with plain process starts, as before warm was the default)."""
    if os.environ.get(WARM_ALL) != "0" or not args or args[0] != "run" or \
            {"--warm", "--no-warm"} & set(args):
        return args
    return ("run", "--no-warm", *args[1:])


class Fleet:
    """The gpufleet CLI bound to one state folder and one CPU-slot count."""

    def __init__(self, home: Path, cwd: Path, slots: int = 2):
        self.home, self.cwd, self.slots = home, cwd, slots
        cwd.mkdir(parents=True, exist_ok=True)

    def env(self, slots: int | None = None, **extra: str) -> dict[str, str]:
        env = _base_env()
        env["GPUFLEET_HOME"] = str(self.home)
        env["GPUFLEET_CPU_SLOTS"] = str(slots if slots is not None else self.slots)
        env.update(extra)
        return env

    def __call__(self, *args: str, timeout: float = DEFAULT_TIMEOUT, slots: int | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *warm_if_asked(args)], env={**self.env(slots), **(env or {})}, cwd=self.cwd,
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        )

    def popen(self, *args: str, slots: int | None = None, sigint_default: bool = False,
              merge_stderr: bool = False) -> subprocess.Popen[str]:
        """Start the CLI without waiting. `sigint_default` restores SIGINT's default disposition
        in the child, as a terminal's foreground job has it (a shell's background job, or a test
        runner started with `&`, would otherwise pass SIGINT down as ignored)."""
        preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sigint_default else None
        return subprocess.Popen(
            [*CLI, *warm_if_asked(args)], env=self.env(slots), cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            text=True, preexec_fn=preexec,
        )

    def ok(self, *args: str, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        r = self(*args, timeout=timeout)
        assert r.returncode == 0, f"gpufleet {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args).stdout)

    def clusters(self, all_: bool = False) -> list[dict[str, Any]]:
        return self.json("list", "--json", *(["--all"] if all_ else []))

    def status(self, job: str) -> dict[str, Any]:
        return self.json("status", job, "--json")

    def peek(self, job: str) -> dict[str, Any] | None:
        """The job's status and step read straight from the state file (sqlite3, read-only), or
        None if it cannot be read now. A poll that costs nothing: `status --json` on an active
        job is a CLI start costing about 1.5 s of CPU, which a job being waited for on two cores
        would lose. It never reconciles, so the waits below still ask the CLI now and then
        (a supervisor that died is found only that way) and always at the end."""
        try:
            db = sqlite3.connect(f"file:{self.home / 'state.db'}?mode=ro", uri=True, timeout=1)
            try:
                row = db.execute("SELECT status, step FROM jobs WHERE name = ?", (job,)).fetchone()
            finally:
                db.close()
        except sqlite3.Error:
            return None
        return None if row is None else {"status": row[0], "step": row[1]}

    def _poll(self, job: str, done: Callable[[dict[str, Any]], bool], timeout: float,
              proc: subprocess.Popen[str] | None = None) -> dict[str, Any]:
        """Wait until `done(status)` holds for the CLI's `status --json` of `job`; peek in
        between (see `peek`), ask the CLI when the peek says so or every few seconds."""
        deadline = time.monotonic() + timeout
        asked = time.monotonic()
        last: dict[str, Any] = {}
        ended: float | None = None  # since when the CLI has said the job ended
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"gpufleet ended early ({proc.returncode}) waiting for {job}:\n{out}\n{err}")
            seen = self.peek(job)
            if seen is None or done(seen) or time.monotonic() - asked >= CLI_EVERY_S:
                asked = time.monotonic()
                r = self("status", job, "--json")
                if r.returncode == 0:
                    last = json.loads(r.stdout)
                    if done(last):
                        return last
                    # an ended job will not get there: fail after the grace, not the timeout
                    ended = (ended or time.monotonic()) if last.get("status") in ENDED else None
                    if ended is not None and time.monotonic() - ended >= ENDED_GRACE_S:
                        pytest.fail(f"job {job} ended ({last.get('status')}) without what this "
                                    f"waits for: {last}")
            time.sleep(0.3)
        pytest.fail(f"job {job}: not reached in {timeout}s: {last}")

    def wait_for_step(self, job: str, step: int = 1, timeout: float = 90.0,
                      proc: subprocess.Popen[str] | None = None) -> dict[str, Any]:
        """Wait until the job's rank 0 has reported `step` (it must still be running then)."""
        def reached(s: dict[str, Any]) -> bool:
            if s["status"] not in ("starting", "running"):
                pytest.fail(f"job {job} ended while waiting for step {step}: {s}")
            return (s.get("step") or 0) >= step and s["status"] == "running"
        return self._poll(job, reached, timeout, proc)

    def wait_for(self, job: str, done: Callable[[dict[str, Any]], bool],
                 timeout: float = 120.0) -> dict[str, Any]:
        """Wait until `done` holds for the job's `status --json` (it is also handed the
        peek's partial dict, so it must read keys with .get)."""
        return self._poll(job, done, timeout)

    def wait_ended(self, job: str, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the job has a final status; its `status --json` then."""
        return self._poll(job, lambda s: s["status"] not in ACTIVE, timeout)

    def cleanup(self) -> list[str]:
        """Stop every cluster (and so every job) of this home; return processes left behind."""
        if (self.home / "state.db").exists():
            try:
                self("stop", "--all", timeout=60)
            except subprocess.TimeoutExpired:
                pass
        left = wait_no_leftovers(self.home)
        for line in left:  # ours: started by this test under its own home
            try:
                psutil.Process(int(line.split(":", 1)[0])).kill()
            except psutil.Error:
                pass
        return left


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


_PREFIX = re.compile(r"^(\[[^\]]*\] )+")  # `[agent] `, `[rank0] `: whose line it is
_RAY_FRAME = re.compile(r'File "(?:[^"]*/site-packages/ray/|python/ray/)')


def tracebacks_not_rays(text: str) -> list[str]:
    """The tracebacks in a job's output other than those Ray Train logs about its own internals
    and goes on from (a busy machine made its autoscaling coordinator's `ray.get` time out: every
    frame in Ray, the job succeeded). Each as its lines; a frame of gpufleet's, of the script or
    of anything but Ray makes a traceback count."""
    lines = [_PREFIX.sub("", ln) for ln in text.splitlines()]
    found = []
    for i, ln in enumerate(lines):
        if not ln.startswith("Traceback (most recent call last):"):
            continue
        block = [ln]
        for nxt in lines[i + 1:]:
            block.append(nxt)
            if not nxt.startswith(" "):  # the exception's own line ends it
                break
        frames = [b for b in block if b.lstrip().startswith('File "')]
        if not frames or not all(_RAY_FRAME.search(f) for f in frames):
            found.append("\n".join(block))
    return found


def serving(home: Fleet, *extra: str) -> Iterator[tuple[str, Fleet]]:
    """`gpufleet server --port 0` with the fleet's home (and `extra` options): its URL and
    the fleet, until the generator is closed; then the server is stopped."""
    home.home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([*CLI, "server", "--port", "0", *extra], env=home.env(), cwd=home.cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = None
    deadline = time.monotonic() + 60
    assert proc.stderr is not None
    while time.monotonic() < deadline and url is None:
        line = proc.stderr.readline()
        found = re.search(r"gpufleet server on (http://\S+)", line)
        if found:
            url = found.group(1)
        elif not line and proc.poll() is not None:
            break
    assert url, f"the server did not start ({proc.poll()})"
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its pipe drained
    try:
        yield url, home
    finally:
        proc.terminate()
        proc.wait(timeout=30)
