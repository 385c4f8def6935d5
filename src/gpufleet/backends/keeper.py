"""The keeper: a tiny single-threaded process between a supervisor and its launcher (torchrun).

Why it exists: a parent-death signal (PR_SET_PDEATHSIG) is tied to the *thread* that forked the
child. When a multi-threaded parent (the supervisor, a Ray actor) is killed, its threads exit one
after another, the child is re-parented to each surviving thread in turn, and the kernel sends the
signal again at every step. torchrun with `--tee` can hang for good in `threading._shutdown`
after a few SIGTERMs 20 ms apart, re-parented to init, its workers zombies, its ports open.

So the supervisor starts this file (`python -I -S keeper.py FD [--after JSON] [--say LINE] --
ARGV...`)
instead of the launcher, and keeps the write end of a pipe (the lifeline) whose read end is FD
here. The keeper:

- becomes a child subreaper, so workers orphaned by their launcher re-parent to it;
- starts ARGV with stdin, stdout, stderr, environment and folder inherited, and with
  PDEATHSIG=SIGTERM, which is safe here: this process has one thread, so it fires once, and
  only if the keeper itself dies;
- ignores SIGTERM, SIGINT and SIGHUP (the supervisor signals the whole tree, the keeper
  included; the keeper ends with the launcher instead);
- when the lifeline reads EOF (the supervisor died, however it died), SIGTERMs the whole tree
  once, SIGKILLs what is left after `GRACE_S`, reaps and exits;
- when the launcher exits by itself, SIGKILLs whatever it left below, and exits with the
  launcher's status (the same signal, re-raised, for a launcher killed by one), so the
  supervisor's `poll()` reads what it read when it started the launcher directly;
- after the tree ended, however it ended, runs the `--after` command (a JSON list; bounded by
  `AFTER_S`) with its output discarded: a launcher inside a container image leaves the
  container behind when its runtime client is killed, and this removes it (launch/container.py).

Stdlib only, and run isolated and without `site`, so it starts in a few milliseconds and a job's
PYTHON* variables or a module beside this file cannot change it. The parent side is `spawn`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

GRACE_S = 5.0  # after the supervisor died: SIGTERM, then SIGKILL this many seconds later
REAP_S = 5.0  # how long the keeper waits for SIGKILLed descendants to be reaped
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STARTS_FAILED_EXIT = 127  # the launcher could not be executed (as a shell says it)
AFTER_S = 30.0  # the longest the `--after` clean-up may take


def prctl(option: int, value: int) -> None:
    """Linux prctl(2); a no-op where there is none (the guarantees then fall to `reconcile`)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def become_subreaper() -> None:
    """Orphaned descendants (their launcher died first) re-parent to us, so we can still end them."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def term_on_parent_death() -> None:
    """Runs in a child between fork and exec: SIGTERM when its parent thread dies. Only for a
    child of a single-threaded parent (see the module docstring)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# -- the parent's side --------------------------------------------------------------------------
def spawn(argv: list[str], env: Mapping[str, str], cwd: Path | str,
          stdout: int | IO[Any] | None = subprocess.PIPE, after: list[str] | None = None,
          say: str | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Start `argv` under a keeper in a new session (stderr merged into `stdout`); the keeper's
    Popen and the lifeline's write end, which the caller keeps open while it wants the tree to
    live (closing it, or dying, ends the tree). os.pipe() makes both ends non-inheritable, so no
    other child of the caller holds the write end; only the keeper gets the read end. `after`:
    a command the keeper runs once the tree has ended (a container's removal). `say`: a line
    the keeper prints first, so it stands in the run's output before the launcher's own
    (which container the launcher runs in)."""
    read_end, write_end = os.pipe()
    extra = ["--after", json.dumps(after)] if after else []
    extra += ["--say", say] if say else []
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(read_end), *extra,
             "--", *argv],
            env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(read_end,))
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return proc, write_end


# -- the pure part ------------------------------------------------------------------------------
def descendants(parents: Mapping[int, int], root: int) -> list[int]:
    """Every pid below `root` in a {pid: parent pid} table, parents before their children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = sorted(children.get(root, []))
    seen = {root}
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def parent_of(stat: str) -> int:
    """The parent pid in a /proc/PID/stat line (the command, in parentheses, may hold spaces
    and parentheses itself: the fields after the last ')' are fixed)."""
    return int(stat[stat.rindex(")") + 2:].split()[1])


# -- the keeper process -------------------------------------------------------------------------
def _parents() -> dict[int, int]:
    table: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    table[int(name)] = parent_of(f.read())
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    return table


def _signal_tree(sig: int) -> int:
    """Send `sig` to every descendant; how many there were. Each pid is opened as a pidfd and
    checked to be still ours before the signal, so a pid reused meanwhile is never hit."""
    table = _parents()
    below = descendants(table, os.getpid())
    ours = {os.getpid(), *below}
    for pid in below:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone
        try:  # the pidfd names one process for good; is it still the one we listed?
            with open(f"/proc/{pid}/stat") as f:
                if parent_of(f.read()) in ours:
                    signal.pidfd_send_signal(fd, sig)
        except (OSError, ValueError, IndexError):
            pass
        finally:
            os.close(fd)
    return len(below)


def _reap(launcher: int, status: list[int]) -> bool:
    """Reap every child that ended; True while some child is still alive. A launcher's status
    goes into `status`."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        if pid == launcher:
            status.append(st)


def _end_tree(launcher: int, status: list[int], first: int, grace_s: float) -> None:
    """`first` (SIGTERM, or SIGKILL for leftovers), then SIGKILL after `grace_s`, reaping."""
    if _signal_tree(first) == 0:
        return
    deadline = time.monotonic() + grace_s
    while _reap(launcher, status) and time.monotonic() < deadline:
        time.sleep(0.05)
    deadline = time.monotonic() + REAP_S
    while _signal_tree(signal.SIGKILL) and time.monotonic() < deadline:
        _reap(launcher, status)
        time.sleep(0.05)
    _reap(launcher, status)


def _exit_as(status: int) -> int:
    """Exit as the launcher did: its code, or the same signal re-raised on ourselves."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        sig = -code
        with contextlib.suppress(OSError, ValueError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the launcher's crash, not ours
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's action cannot be set
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return code


def _ignore(_sig: int, _frame: object) -> None:
    """A handler rather than SIG_IGN: an ignored signal would stay ignored in the launcher."""


def main(args: list[str]) -> int:
    lifeline = int(args[0])
    split = args.index("--")
    argv = args[split + 1:]
    after: list[str] = json.loads(args[args.index("--after") + 1]) if "--after" in args[:split] else []
    if "--say" in args[:split]:
        print(args[args.index("--say") + 1], flush=True)
    try:
        status = _keep(lifeline, argv)
    finally:
        if after:
            _run_after(after)
    return status if isinstance(status, int) else _exit_as(status[0])


def _run_after(argv: list[str]) -> None:
    """The clean-up after the tree (see the module docstring); its failure changes nothing."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=AFTER_S, check=False)


def _keep(lifeline: int, argv: list[str]) -> int | tuple[int]:
    """Keep the tree; the launcher's wait status (a 1-tuple, to exit as it did), or a code."""
    os.set_inheritable(lifeline, False)
    become_subreaper()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, _ignore)  # SIGCHLD's handler only makes it wake the select below
    me = os.getpid()

    def in_child() -> None:
        term_on_parent_death()
        if os.getppid() != me:  # the keeper died before the signal was asked for
            os._exit(1)

    try:
        # held until we return: a Popen dropped earlier would reap the launcher in __del__ and
        # take its exit status from us
        proc = subprocess.Popen(argv, preexec_fn=in_child)
    except OSError as exc:
        print(f"gpufleet: cannot start {argv[0] if argv else 'nothing'}: {exc}", flush=True)
        return STARTS_FAILED_EXIT
    launcher = proc.pid
    status: list[int] = []
    while not status:
        ready, _, _ = select.select([lifeline, wake_r], [], [])
        with contextlib.suppress(OSError):
            os.read(wake_r, 512)
        _reap(launcher, status)
        if not status and lifeline in ready and os.read(lifeline, 1) == b"":
            _end_tree(launcher, status, signal.SIGTERM, GRACE_S)  # the supervisor is gone
            return (status[0],) if status else 1
    _end_tree(launcher, status, signal.SIGKILL, 0.0)  # what the launcher left behind
    return (status[0],)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
