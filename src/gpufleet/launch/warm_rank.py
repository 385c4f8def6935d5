"""One rank of a warm start: what a worker forked from the warm process runs (launch/warm.py).

A worker forked from the forkserver did not start a Python of its own, so nothing a fresh
interpreter does per process has happened for it: its environment (RANK, the devices) was set
by torch's elastic agent just before this runs, and the bootstrap's `sitecustomize` ran once
in the forkserver, where there was no rank to arm. So this does, in order, what a fresh
`python script.py` under torchrun would have done: arm the bootstrap for this rank, make
`sys.argv` and `sys.path[0]` the script's, and run the script (or `-m` module) as `__main__`
through `runpy` (which puts it in `sys.modules["__main__"]` while it runs, so a spawned
DataLoader worker finds the script's classes as under a fresh start).

It stays importable without torch: the forkserver imports the heavy modules, not this.
"""

from __future__ import annotations

import atexit
import os
import re
import runpy
import sys
from collections.abc import Callable, Mapping
from types import ModuleType

NAME_RE = re.compile(r"gfr(\d+)l(\d+)")


def process_name(environ: Mapping[str, str]) -> str:
    """The rank's process name (Linux's 15-character `comm`): its ranks, readable from outside.
    A forked worker's /proc/PID/environ is the forkserver's (its RANK was set after the fork),
    so telemetry finds a warm rank by this name instead (`rank_in_name`)."""
    return f"gfr{environ.get('RANK', '')}l{environ.get('LOCAL_RANK', '')}"[:15]


def rank_in_name(name: str, var: str) -> str | None:
    """RANK or LOCAL_RANK (`var`) from a warm rank's process name; None for any other name."""
    m = NAME_RE.fullmatch(name)
    if m is None:
        return None
    return m.group(2) if var == "LOCAL_RANK" else m.group(1)


def _name_process() -> None:
    """`prctl(PR_SET_NAME)`; a system without it keeps the name (telemetry then misses it)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, process_name(os.environ).encode(), 0, 0, 0)  # 15: PR_SET_NAME
    except (OSError, AttributeError):
        pass


def run(script: str, as_module: str, *args: str) -> None:
    """The rank's script with `args`; `as_module` "1": `script` is a module name (`-m`)."""
    import multiprocessing.util

    from gpufleet.launch.warm_restart import rank_env

    # a restart inside the running launcher: the next run's variables (its number), which the
    # forkserver, started with the first run, does not have (warm_restart.py)
    os.environ.update(rank_env(os.environ))
    _name_process()
    _arm_bootstrap()
    _keep_left_groups()
    multiprocessing.util.Finalize(None, _at_exit, exitpriority=100)
    sys.argv = [script, *args]  # for a module, runpy puts the module's file in argv[0]
    # sys.path is the launcher's, which `python -m` began with the working folder: what a
    # `python -m` worker has too; `python script.py` has the script's folder there instead
    first = os.path.dirname(os.path.abspath(script)) if as_module != "1" else os.getcwd()
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = first
    else:
        sys.path.insert(0, first)
    if as_module == "1":
        _guarded(lambda: runpy.run_module(script, run_name="__main__", alter_sys=True))
    else:
        _guarded(lambda: runpy.run_path(script, run_name="__main__"))


def _arm_bootstrap() -> None:
    """The bootstrap, as `sitecustomize` arms it in a fresh worker (its failure never stops
    the script)."""
    try:
        from gpufleet.bootstrap import enabled, worker

        if enabled(dict(os.environ)):
            worker.arm()
    except Exception as exc:
        print(f"gpufleet bootstrap: not armed ({exc!r})", file=sys.stderr)


_KEPT: list[object] = []  # what each script left behind, freed only with the process (below)


def _keep_left_groups() -> None:
    """Every process group the script leaves (`destroy_process_group`) is kept until the
    process ends, as what it leaves at its end is (`_guarded`, below, says why). A script that
    leaves the group and then returns from its `main()` frees its DDP model there, during the
    run, and the model's reducer held the group's last reference: the same wait, which keeping
    the script's globals cannot prevent (the PyTorch DDP tutorial's `cleanup()` is that
    pattern). torch forgets a group it destroys, so it is taken from its registry first."""
    from gpufleet.bootstrap import importwatch

    def keep(c10d: ModuleType) -> None:
        import functools

        inner = getattr(c10d, "destroy_process_group", None)
        if inner is None:
            return

        @functools.wraps(inner)
        def destroy_process_group(*args: object, **kwargs: object) -> object:
            group = args[0] if args else kwargs.get("group")
            world = getattr(c10d, "_world", None)
            _KEPT.extend(list(getattr(world, "pg_map", None) or ()) if group is None
                         else [group])
            return inner(*args, **kwargs)

        importwatch.rebind("destroy_process_group", inner, destroy_process_group)

    importwatch.when_imported("torch.distributed.distributed_c10d", keep)


def _guarded(body: Callable[[], object]) -> None:
    """Run the script; an uncaught exception goes through `sys.excepthook` as at a fresh
    interpreter's end (the bootstrap's hook writes the rank's error record) and ends the rank
    with exit 1.

    What the script leaves (its globals, through runpy's copy or the frames of its exception)
    is kept until the process ends instead of being freed here, on the main thread, holding
    the GIL: freeing a DDP model frees its gloo process group, whose destructor waits for its
    worker thread, which may still need the GIL to free the last backward's allreduce (torch
    keeps a Python object in that work's state), and both wait forever. Seen here as a rank
    that printed its last line and never ended, on a loaded machine (pytorch/pytorch#56297).
    A fresh interpreter frees them only while it finalizes, where a thread asking for the GIL
    is made to exit instead; a forked rank ends through `os._exit` and frees nothing, which
    Python allows (`__del__` is not promised for objects alive at exit). The files they hold
    are flushed at the end (`_at_exit`)."""
    try:
        _KEPT.append(body())
    except SystemExit as exc:
        _KEPT.append(exc)
        raise
    except BaseException as exc:  # what an interpreter's top level sees
        _KEPT.append(exc)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        raise SystemExit(1) from None


def _at_exit() -> None:
    """The script's and the bootstrap's `atexit` handlers, as a fresh interpreter runs them
    at its end. A multiprocessing child ends through `os._exit`, which skips them, so they
    are run from multiprocessing's own exit step instead: after torch's agent has the rank's
    result (a handler that ends the process itself, as gpufleet.train's does, would otherwise
    leave the agent waiting for it), before the process ends. multiprocessing's own handler
    is the one running them: it is not run twice."""
    import multiprocessing.util

    atexit.unregister(getattr(multiprocessing.util, "_exit_function"))  # noqa: B009 - private
    atexit._run_exitfuncs()
    try:
        _flush_files()
    except Exception as exc:  # an odd object met on the walk must not change how the rank ends
        print(f"gpufleet: open files not flushed: {exc!r}", file=sys.stderr)


FLUSH_WALK_MAX = 200_000  # objects walked to find the script's files (a few ms per 10,000)


def _flush_files() -> None:
    """Write what the script's open files still buffer, as their deallocation does at a fresh
    interpreter's end (this rank's objects are never freed: `_guarded`). Found by walking what
    the script left, nearest first and at most `FLUSH_WALK_MAX` objects (a script holding
    millions of Python objects is not walked to its end), not every object of the process:
    files the forkserver held before the fork (their buffers copied into every rank) must not
    be written once per rank, and modules and classes are not the script's."""
    import gc
    import io
    from collections import deque

    modules = {id(getattr(m, "__dict__", None)) for m in list(sys.modules.values())}
    seen: set[int] = set()
    todo = deque(_KEPT)
    while todo and len(seen) < FLUSH_WALK_MAX:
        obj = todo.popleft()
        if id(obj) in seen or id(obj) in modules or isinstance(obj, (ModuleType, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):  # a closed, detached or broken file: nothing to do
                pass
        if len(todo) < FLUSH_WALK_MAX:
            todo.extend(r for r in gc.get_referents(obj) if gc.is_tracked(r))
