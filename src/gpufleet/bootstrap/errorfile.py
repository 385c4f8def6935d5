"""A worker's uncaught exception, written to torchrun's per-rank error file.

torchrun gives every worker its own error file (TORCHELASTIC_ERROR_FILE, under the agent's
`--log-dir`) and reads it back when the worker fails: its failure summary then shows that
traceback, and gpufleet's supervisor takes the failure reason from it instead of from log tails
that `--tee` interleaves. torch fills the file only for scripts that wrap their entry point in
`torch.distributed.elastic.multiprocessing.errors.record`; this hook fills it for any script.

The layout is the one torch's ErrorHandler writes and its ProcessFailure reads (torch 2.13,
torch/distributed/elastic/multiprocessing/errors/error_handler.py `record_exception` and
__init__.py `ProcessFailure._get_error_data`):

    {"message": {"message": "<Type>: <text>",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<unix seconds>"}}}

torch reads only those keys, so the extra ones here are safe: `time_ns` (torch's timestamp is
whole seconds, too coarse to order two ranks failing in the same second), `exception_type`
(qualified) and `exception_message`, so nobody has to split the message string, and `rank`
(the global rank: the file's folder is named by the local one, which differs across nodes).

It must not import torch: it is armed at interpreter start-up, before the script imports
anything, and in scripts that never use torch at all.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from types import TracebackType

ENV = "TORCHELASTIC_ERROR_FILE"

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


def record(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None,
           now_ns: int, rank: str | None) -> dict[str, object]:
    """The error file's content for one exception (pure: the clock and the rank are passed
    in). The rank is the global one (torchrun's RANK): the file's folder names the local one."""
    qualified = exc_type.__qualname__
    if exc_type.__module__ not in ("builtins", "__main__"):
        qualified = f"{exc_type.__module__}.{qualified}"
    return {"message": {
        "message": f"{exc_type.__name__}: {exc}",  # torch's own wording of the exception
        "extraInfo": {
            "py_callstack": "".join(traceback.format_exception(exc_type, exc, tb)),
            "timestamp": str(now_ns // 1_000_000_000),
            "time_ns": str(now_ns),
            "exception_type": qualified,
            "exception_message": str(exc),
            **({"rank": rank} if rank is not None else {}),
        },
    }}


def write(path: str, content: dict[str, object]) -> bool:
    """Write the file unless it exists already (a script using torch's `@record` wrote its
    own, which wins); True when written. Created exclusively, so a racing writer cannot be
    overwritten either."""
    try:
        with open(path, "x", encoding="utf-8") as f:
            json.dump(content, f)
    except FileExistsError:
        return False
    return True


def _hook(previous: ExceptHook) -> ExceptHook:
    def excepthook(exc_type: type[BaseException], exc: BaseException,
                   tb: TracebackType | None) -> None:
        path = os.environ.get(ENV)
        if path:
            try:
                write(path, record(exc_type, exc, tb, time.time_ns(), os.environ.get("RANK")))
            except Exception as err:  # the record is a help; the traceback below still prints
                print(f"gpufleet bootstrap: no error file written ({err!r})", file=sys.stderr)
        previous(exc_type, exc, tb)

    excepthook.gpufleet_error_file = True  # type: ignore[attr-defined]
    return excepthook


def install() -> None:
    """Chain the hook in front of the current `sys.excepthook` (once; the previous hook still
    prints the traceback as before). Does nothing outside a torchrun worker."""
    if not os.environ.get(ENV) or getattr(sys.excepthook, "gpufleet_error_file", False):
        return
    sys.excepthook = _hook(sys.excepthook)
