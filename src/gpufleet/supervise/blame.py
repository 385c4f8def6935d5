"""Which rank's exception is the failure reason, from torchrun's per-rank error records. Pure.

The worker bootstrap (bootstrap/errorfile.py), or torch's own `@record`, writes each failing
rank's uncaught exception to its error file; torchrun's failure summary gives the exit codes.
When one rank raises, the others see their peer vanish (a closed connection, a
DistNetworkError) and torchrun then ends them with SIGTERM: so the cause is the earliest
record that is not such a knock-on, never one of a rank torchrun ended after the first
failure (see `blame` for a rank it ended while that rank was shutting down after raising).
With no such record the caller falls back to reading the log tails (`logs.failed_rank`).

Record dicts are in the layout torch's ErrorHandler writes (see bootstrap/errorfile.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.telemetry.tracebacks import is_knock_on

LAST_LINES = 8  # of the traceback, shown with a failure


@dataclass(frozen=True)
class ErrorRecord:
    """One rank's recorded exception."""

    rank: int
    kind: str  # the exception's class name, e.g. "RuntimeError"
    error: str  # "RuntimeError: boom at step 3"
    callstack: str  # the formatted traceback ("" when the record has none)
    time_ns: int  # when it was raised (torch's whole seconds when that is all there is)


@dataclass(frozen=True)
class Tail:
    """How a failure reads at the end: the rank that failed first, its exit code, the lines to
    show (its traceback's end, or its last log lines) and its exception. `recorded`: taken from
    an error record, so `error` is exact and the lines are its traceback, not the log's tail."""

    rank: int | None
    rank_code: int | None
    last: tuple[str, ...]
    error: str | None = None
    recorded: bool = False


@dataclass(frozen=True)
class Blame:
    """The rank that caused a failure, its exit code (None: not in torchrun's summary), its
    exception and the last lines of its traceback."""

    rank: int
    code: int | None
    error: str
    lines: tuple[str, ...]


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def parse(data: Mapping[str, Any], rank: int | None) -> ErrorRecord | None:
    """An error file's content as a record; `rank` is where the file was found (None: not
    known), a rank the record names itself wins. None for a file that holds no exception
    (torch's signal-only form, a bare string, or a layout this does not know)."""
    message = data.get("message")
    if not isinstance(message, Mapping):
        return None  # torch writes a plain string for a signal: no exception to quote
    extra = message.get("extraInfo")
    extra = extra if isinstance(extra, Mapping) else {}
    text = message.get("message")
    if not isinstance(text, str) or not text.strip():
        return None
    own = _int(extra.get("rank"))
    rank = own if own is not None else rank
    if rank is None:
        return None
    qualified = extra.get("exception_type")
    kind = (qualified.rsplit(".", 1)[-1] if isinstance(qualified, str) and qualified
            else text.split(":", 1)[0].strip())
    stamp = _int(extra.get("time_ns"))
    if stamp is None:
        seconds = _int(extra.get("timestamp"))
        stamp = seconds * 1_000_000_000 if seconds is not None else 0
    stack = extra.get("py_callstack")
    return ErrorRecord(rank=rank, kind=kind, error=text.strip(),
                       callstack=stack if isinstance(stack, str) else "", time_ns=stamp)


def signalled(code: int | None) -> bool:
    """An exit code that says a signal ended the process (torchrun's -N, or a shell's 128+N)."""
    return code is not None and (code < 0 or 128 < code < 160)


def blame(records: Iterable[ErrorRecord], codes: Mapping[int, int]) -> Blame | None:
    """The earliest record (by time, then rank) that is not a knock-on; None when there is none
    (the caller then reads the logs).

    A rank torchrun ended with a signal is a victim (it was SIGTERMed after the first failure)
    unless its record predates every record of the ranks that exited on their own: then it
    raised first and torchrun's SIGTERM only caught it while it shut down (its process group
    closing is what made a peer raise and exit first). Its exit code then says nothing of the
    failure, so it is left out (None).
    """
    records = list(records)
    own = [r for r in records if not signalled(codes.get(r.rank))]
    first_own = min((r.time_ns for r in own), default=None)
    causes = [r for r in records if not is_knock_on(r.kind, r.error) and (
        r in own or first_own is None or r.time_ns < first_own)]
    if not causes:
        return None
    first = min(causes, key=lambda r: (r.time_ns, r.rank))
    lines = tuple(ln for ln in first.callstack.rstrip("\n").splitlines() if ln.strip())
    code = codes.get(first.rank)
    return Blame(rank=first.rank, code=None if signalled(code) else code, error=first.error,
                 lines=lines[-LAST_LINES:] or (first.error,))


_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_FILE = re.compile(r"^\s*error_file\s*:\s*(\S+)")


@dataclass(frozen=True)
class Summary:
    """What torchrun's failure summary (its agent's last lines) says per failed rank."""

    codes: dict[int, int]  # exit codes
    files: dict[str, int]  # error file path -> rank
    root: int | None  # the rank of its 'Root Cause' block: the first exit it saw
    roots: tuple[int, ...] = ()  # every summary's (one per node's torchrun), in log order


def summary(agent_lines: Iterable[str]) -> Summary:
    """Read the blocks of torchrun's failure summary ("rank : R (local_rank: L)", "exitcode :
    C", "error_file: PATH"); lines of other kinds in between are skipped. Each node of a
    multi-node job has a torchrun that prints a summary of its own ranks: all are read (the
    first node to report is often a peer's victim)."""
    codes: dict[int, int] = {}
    files: dict[str, int] = {}
    roots: list[int] = []
    in_root = False
    rank: int | None = None
    for line in agent_lines:
        if "Root Cause" in line:
            in_root = True
        if m := _RANK.match(line):
            rank = int(m.group(1))
            if in_root:
                roots.append(rank)
                in_root = False
        elif rank is not None and (m := _EXIT.match(line)):
            codes.setdefault(rank, int(m.group(1)))
        elif rank is not None and (m := _FILE.match(line)) and m.group(1) != "<N/A>":
            files.setdefault(m.group(1), rank)
    return Summary(codes, files, roots[0] if roots else None, tuple(roots))


def in_summary(line: str) -> bool:
    """Whether an agent line is one `summary` reads: a multi-node job's summaries (about 60
    lines per node with the tracebacks warm workers print) scroll out of the agent's tail."""
    return "Root Cause" in line or any(p.match(line) for p in (_RANK, _EXIT, _FILE))
