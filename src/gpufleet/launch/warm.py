"""torchrun whose workers start warm: forked from a process that has torch imported already.

    python -m gpufleet.launch.warm [--preload MOD,...] -- TORCHRUN_ARGS... SCRIPT ARGS...

A fresh worker spends seconds importing torch (about 2.7 s of CPU each on the 2-core test
machine), at every start and every restart. Here torchrun's own launcher runs as usual (its
arguments, rendezvous, log files, restarts and exit codes unchanged), except that its workers
are Python functions started through multiprocessing's forkserver, whose server imports
`BASE_PRELOAD` and the `--preload` modules once (`set_forkserver_preload`); each
worker is a fork of it and runs `warm_rank.run`, which does per rank what a fresh interpreter
would (the bootstrap armed, argv, sys.path, `__main__`).

Frozen in the forkserver, so shared by every rank: what those modules do at import. torch
reads no rank's settings then (the devices and thread counts are read at first use), and the
forkserver must have no CUDA context, which a fork cannot carry: the `--preload` modules are
imported here too (while the forkserver imports them) and checked before any worker forks
(`torch.cuda.is_initialized()`); when one fails, the workers start cold, as plain torchrun's,
with a warning line and a `warm_off` event that say why. A started OpenMP pool is not
detected (docs/warm.md).

With `GPUFLEET_RESTART_FILE` set (every pool sets it), a failed worker group does not end
the launcher: it waits for the supervisor's decision and restarts in place (warm_restart.py).

The `__main__` guard is what keeps the forkserver from running this launcher again (it
imports the launcher's main module as `__mp_main__`).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpufleet.launch.store_peers import PEERS_GONE_S, store_port, wait_gone

# torch._dynamo: torch imports it when a script makes its first optimizer (1.1-1.5 s here)
BASE_PRELOAD = ("torch", "torch.distributed", "torch._dynamo")
FREEZE = "gpufleet.launch.warm_freeze"  # last: what the preloads made, out of the rank's gc
IN_PLACE_RESTARTS = 1_000_000  # torch's count; every restart is the supervisor's decision
WARM_FAILED = "gpufleet: warm start off"  # the warning's first words, as the supervisor shows it


def split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(`--preload` modules, torchrun's arguments) from this launcher's command line (pure)."""
    preload: list[str] = []
    rest = list(argv)
    while rest and rest[0] != "--":
        head = rest.pop(0)
        if head == "--preload" and rest:
            preload += [m.strip() for m in rest.pop(0).split(",") if m.strip()]
        elif head.startswith("--preload="):
            preload += [m.strip() for m in head.split("=", 1)[1].split(",") if m.strip()]
        else:
            raise SystemExit(f"gpufleet.launch.warm: unknown option {head!r}; "
                             f"usage: [--preload MOD,...] -- TORCHRUN_ARGS")
    return preload, rest[1:] if rest else []


def unsafe(preload: Sequence[str]) -> str | None:
    """Why forking workers from a process that imported `preload` would be unsafe, or None:
    imported here (the launcher has torch already) and checked as the forkserver will be."""
    import importlib

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any failure of a user's module
            return f"--preload {name} could not be imported: {exc!r}"
    import torch

    if torch.cuda.is_initialized():
        return f"importing {', '.join(preload) or 'torch'} initialised CUDA, which a fork cannot carry"
    return None


def main(argv: Sequence[str]) -> None:
    """torchrun's `main` (its argument parsing and its error summary on a failed worker), with
    the workers made functions forked from the warm forkserver."""
    import multiprocessing
    import multiprocessing.forkserver

    preload, args = split(argv)
    # the forkserver starts now and imports torch while this process imports it too: on a
    # node with a core to spare the two imports overlap (what a cold start pays twice in a row,
    # the launcher's import then its workers')
    multiprocessing.set_forkserver_preload([*BASE_PRELOAD, *preload, FREEZE])
    multiprocessing.forkserver.ensure_running()

    from torch.distributed import run as torchrun

    _plain_tracebacks()
    _exit_zero_is_done()
    _every_failure()
    _one_stop_signal()
    _closing_lets_workers_leave()
    _store_outlives_the_run()

    from gpufleet.launch import warm_rank, warm_restart

    why = unsafe(preload)
    if why is not None:
        print(f"{WARM_FAILED}: {why}; workers start cold", file=sys.stderr, flush=True)
        from gpufleet.train.report import send_launcher_note

        send_launcher_note("warm_off", why=why)  # the job's events say so too
        _ended(lambda: torchrun.main(args), store_port(args))
    plain = torchrun.config_from_args
    in_place = os.environ.get(warm_restart.RESTART_FILE_VAR)
    if in_place:  # failed workers wait for the supervisor's decision (warm_restart.py)
        warm_restart.install(Path(in_place))
        # a store of the agent's shared with the workers outlives a run, and the next run's
        # ranks read the dead run's gloo addresses from it ("Connection refused": seen here
        # with torch 2.13, pytorch/pytorch#135712): each run's rank 0 holds its own
        os.environ[warm_restart.OWN_STORE_VAR] = "1"

    def config_from_args(a: Any) -> tuple[Any, Any, list[str]]:
        config, _cmd, _cmd_args = plain(a)
        if in_place:  # so the agent asks `_restart_workers`, which asks the supervisor
            config.max_restarts = IN_PLACE_RESTARTS
        return config, warm_rank.run, [a.training_script, "1" if a.module else "0",
                                       *a.training_script_args]

    torchrun.config_from_args = config_from_args
    _ended(lambda: torchrun.main(["--start-method", "forkserver", *args]), store_port(args))


def _plain_tracebacks() -> None:
    """A worker's failure is logged with its traceback by torch's function-worker path (not by
    the subprocess path plain torchrun takes), and torch's log formatter imports all of
    torch._dynamo (1.2 s here) to read one setting before it formats a traceback, at the
    moment the launcher should be ending or restarting the group. The traceback is formatted
    here instead, by the logging module's own formatter, as torch's would have."""
    import logging

    def formatted(record: logging.LogRecord) -> bool:
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return True

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(formatted)


def _exit_zero_is_done() -> None:
    """A function worker is done for torch once its return value arrived; one that ended with
    `os._exit(0)` (gpufleet's Checkpointer after saving for a resize, or any script that ends
    that way) never sends one, and torch's agent then waited for it forever with no worker
    left. Here a worker that exited 0 with nothing in its queue counts as done, returning None,
    as a script's exit 0 does under plain torchrun."""

    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    done = MultiprocessContext._is_done

    def is_done(self: Any) -> bool:
        if self._pc is not None:
            for i, proc in enumerate(self._pc.processes):
                if proc.exitcode == 0 and i not in self._return_values \
                        and self._ret_vals[i].empty():
                    self._return_values[i] = None
        return bool(done(self))

    setattr(MultiprocessContext, "_is_done", is_done)  # noqa: B010 - a patch


def _every_failure() -> None:
    """torch's function-worker path reports one failed worker, the first its poll finds (in
    rank order), where plain torchrun's subprocess path lists every worker that had failed by
    then. A rank killed with SIGKILL was then left out whenever its peer, failing on the closed
    connection, was found in the same poll: the job was blamed on the peer's knock-on ('rank 0
    failed: Connection reset by peer', 5 of 10 runs next to two CPU burners here, and in CI).
    Here every worker that had ended with a failure before torch ends the others (its `close`)
    is added to the result, with its exit code and error file, as the subprocess path would."""

    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext, ProcessFailure

    poll = MultiprocessContext._poll

    def every_failure(self: Any) -> Any:
        ended: dict[int, tuple[int, int]] = {}
        close = self.close

        def close_after_looking(*args: Any, **kwargs: Any) -> Any:
            for i, proc in enumerate(self._pc.processes if self._pc is not None else ()):
                code = proc.exitcode  # None while it runs: the ones close() is about to end
                if code:
                    ended[i] = (proc.pid, code)
            return close(*args, **kwargs)

        self.close = close_after_looking
        try:
            result = poll(self)
        finally:
            del self.close
        if result is not None and result.failures:
            for i, (pid, code) in ended.items():
                if i not in result.failures:
                    result.failures[i] = ProcessFailure(local_rank=i, pid=pid, exitcode=code,
                                                        error_file=self.error_files[i])
        return result

    setattr(MultiprocessContext, "_poll", every_failure)  # noqa: B010 - a patch


def _one_stop_signal() -> None:
    """The first SIGTERM (or SIGINT, SIGHUP, SIGQUIT) starts torch's orderly shutdown: the
    workers are sent the signal, given their time to end, and what they print meanwhile is
    copied to this launcher's output until the copying threads are stopped. torch raises again
    on every later signal, and a stop does send several: gpufleet's to every process below
    the keeper and, in an image, podman's proxy of it to the container's first process. The
    second one cut the shutdown short: the launcher ended at once, its workers' last lines
    (a checkpoint saved on SIGTERM, say) never reached the job's log, and nobody waited for
    the workers it had just signalled. Here the later signals are let go; the shutdown the
    first began goes on, and SIGKILL, after the stop's grace, still ends it."""
    from torch.distributed.elastic.multiprocessing import api

    first = api._terminate_process_handler
    seen: list[int] = []

    def once(signum: int, frame: Any) -> None:
        if not seen:
            seen.append(signum)
            first(signum, frame)

    setattr(api, "_terminate_process_handler", once)  # noqa: B010 - a patch


def _closing_lets_workers_leave() -> None:
    """A function worker whose script ends with exit 0 puts its result in a queue and then
    waits until torch's agent says it has read them all, which the agent says only while it
    polls a running group. While it ends the group (a stop: SIGTERM to every worker, then a
    wait of up to 30 s), it never says it, so a script that saved its checkpoint on SIGTERM
    and exited 0 waited out the 30 s and was killed with SIGKILL (seen here; a plain worker
    simply ends). Here the agent says so as it starts ending the group: nothing reads the
    results after that."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    close = MultiprocessContext._close

    def closing(self: Any, death_sig: Any, timeout: int = 30) -> None:
        self._worker_finished_event.set()
        close(self, death_sig, timeout)

    setattr(MultiprocessContext, "_close", closing)  # noqa: B010 - a patch


_KEPT: list[Any] = []  # the rendezvous stores this launcher hosted, alive until it ends


def _store_outlives_the_run() -> None:
    """torch's rendezvous store is an object of the launcher's rendezvous handler, and its
    server (the one a head node hosts for every node's agent) stops when the object is freed,
    as `torchrun.main` returns. Another node's agent still closing the rendezvous through it
    then lost its connection mid-request and logged "failed to shutdown the rendezvous ...
    RendezvousConnectionError" at the end of a job that had succeeded (seen in the suite on the
    Ray pool; by hand, a peer's request after the head's store was freed fails with the same
    words). Kept here, the store serves until this launcher ends, after `_ended` has waited
    for the other agents to let go of it."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d

    create = c10d.create_backend

    def kept(params: Any) -> Any:
        backend, store = create(params)
        _KEPT.append(store)
        return backend, store

    setattr(c10d, "create_backend", kept)  # noqa: B010 - a patch


def _ended(launcher: Callable[[], None], port: int | None) -> NoReturn:
    """Run torchrun's launcher, then end this process as Python would (its exit code, the
    traceback of what ended it) but without the interpreter's teardown: multiprocessing's
    exit step (joining the dead workers through the forkserver) took 0.9 s here after every
    run, a failed one included, which the supervisor would wait for before a restart. Nothing
    needs the join: the workers are gone, and the forkserver and multiprocessing's resource
    tracker end by themselves once this process's end of their pipes closes. Its finalizers
    do run (they remove the forkserver's socket folder). A head node whose launcher hosts the
    rendezvous store (`port`) and succeeded first waits for the other nodes' agents to let go
    of it (launch/store_peers.py: they close the rendezvous through it as they end)."""
    code = 0
    try:
        launcher()
    except SystemExit as exc:
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter's top level would print
        traceback.print_exc()
        code = 1
    if port is not None and code == 0:
        left = wait_gone(port)
        if left:
            print(f"gpufleet: {left} connection(s) of other nodes' agents still open on the "
                  f"rendezvous store after {PEERS_GONE_S:.0f} s; the head ends anyway",
                  file=sys.stderr)
    import multiprocessing.util

    # multiprocessing's finalizers, without its join of every worker it started: the folder of
    # the forkserver's socket (/tmp/pymp-*) is removed by one, and would be left behind
    getattr(multiprocessing.util, "_run_finalizers")()  # noqa: B009 - private
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
