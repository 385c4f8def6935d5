"""The first real error in the workers' output, told apart from its echoes. Pure.

When one rank raises (a PermissionError writing a checkpoint, a bug), the others do not see
the error: they see their peer vanish in the middle of a collective ("Connection closed by
peer", a gloo or NCCL timeout, a DistBackendError) and torchrun then ends them (SIGTERM, its
ChildFailedError). Read line by line, those echoes look like an interconnect failure; the cause
is the one traceback that ends in something else. `first_error` finds it, so the diagnosis
can name it and stay quiet about the communication errors it caused.

The lines are `Inputs.log_tail`: each rank's recent lines in turn, prefixed `[rank N] `, the
agent's (torchrun's) unprefixed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_RANK = re.compile(r"^\[rank (\d+)\] ")
_TRACEBACK = "Traceback (most recent call last)"
# the last line of a traceback: "PermissionError: [Errno 13] ..." or "torch.x.DistBackendError"
_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt|Exit))\b(?::.*)?$")
# How a rank sees a peer vanish (and how torchrun ends the survivors): never a cause of its own.
_KNOCK_ON_KINDS = frozenset({
    "DistNetworkError", "DistStoreError", "ChildFailedError", "SignalException",
    "KeyboardInterrupt", "SystemExit", "BrokenPipeError", "ConnectionResetError",
    "ConnectionAbortedError"})
_KNOCK_ON_WORDS = re.compile(
    r"connection (?:closed|reset) by peer|broken pipe|communicator was aborted"
    r"|remote process exited|got signal|connection refused", re.IGNORECASE)
# A communication failure of its own: a collective that timed out, an NCCL or gloo error. The
# comm rule's subject, not an "ordinary" exception; words alone ("NCCL" in "Distributed package
# doesn't have NCCL built in") do not make one.
_COMM_KINDS = frozenset({"DistBackendError", "DistError", "TimeoutError"})
_COMM_WORDS = re.compile(
    r"timed out|\btimeout\b|watchdog|NCCL error|NCCL WARN|nccl\w*Error|collective operation",
    re.IGNORECASE)


def is_knock_on(kind: str, line: str) -> bool:
    """Whether a raised error is how a rank sees another rank die (a closed connection, a
    store that went away, torchrun's SIGTERM): never the cause of a failure."""
    return kind in _KNOCK_ON_KINDS or bool(_KNOCK_ON_WORDS.search(line))


def is_comm_failure(kind: str, line: str) -> bool:
    """Whether a raised error is a communication failure of its own (a timeout, an NCCL error)."""
    return kind in _COMM_KINDS or bool(_COMM_WORDS.search(line))


@dataclass(frozen=True)
class RaisedError:
    rank: int | None  # None: the agent's own output (or a line without a rank prefix)
    kind: str  # the exception's class name, e.g. "PermissionError"
    line: str  # its last traceback line, e.g. "PermissionError: [Errno 13] Permission denied: ..."


def is_echo(kind: str, line: str) -> bool:
    """Whether a raised error is a communication error (a knock-on of a peer's failure, or a
    collective failing), not an ordinary exception of the rank's own code."""
    return is_knock_on(kind, line) or is_comm_failure(kind, line)


def raised(lines: Iterable[str]) -> list[RaisedError]:
    """Every exception that ends a traceback in these lines, in order, per rank as they come.
    A line counts only after a 'Traceback' line of the same rank: an error a script merely
    prints (or a library logs) is not one that ended a process."""
    found: list[RaisedError] = []
    in_traceback: set[int | None] = set()
    for line in lines:
        m = _RANK.match(line)
        rank = int(m.group(1)) if m else None
        text = line[m.end():] if m else line
        if _TRACEBACK in text:
            in_traceback.add(rank)
            continue
        if rank not in in_traceback:
            continue
        hit = _RAISED.match(text.strip())
        if hit:
            found.append(RaisedError(rank, hit.group(1), text.strip()))
    return found


def first_error(lines: Iterable[str], prefer: int | None = None) -> RaisedError | None:
    """The error that caused the others: the first raised error that is not an echo, on the
    lowest rank that has one (the tail keeps no order between ranks), or on `prefer` (the rank
    the failure reason blames from its error record, which knows the order) when that rank has
    one; None when every error is an echo (a real communication failure, or a rank that was
    killed) or there is none."""
    causes = [e for e in raised(lines) if not is_echo(e.kind, e.line)]
    ranked = [e for e in causes if e.rank is not None]
    preferred = [e for e in ranked if prefer is not None and e.rank == prefer]
    if preferred:
        return preferred[0]
    if ranked:
        return min(ranked, key=lambda e: e.rank if e.rank is not None else 0)  # first of ties
    return causes[0] if causes else None
