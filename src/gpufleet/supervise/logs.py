"""Splitting torchrun's combined output into one log per rank.

torchrun (with `--tee` and our prefix template) prefixes each worker line with `[rankN]:`; its
own lines (the elastic agent's) have no prefix and go to the agent log.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

_RAY_TAG = re.compile(r"^(?:\x1b\[[0-9;]*m)?\([A-Za-z_]\w* pid=\d+(?:, ip=[^)]*)?\)(?:\x1b\[[0-9;]*m)? ")
_HOROVOD_TAG = re.compile(r"^\[(\d+)\]<std(?:out|err)>:")  # horovodrun's own rank tag
_PREFIX = re.compile(r"^\[(?:[\w.-]+ )?rank(\d+)\]:(.*)$", re.DOTALL)
_NODE_TAG = re.compile(r"^\[[\w.-]+\]: ")  # a node agent's own line, from the Ray driver
TAIL_LINES = 40


def split_line(line: str) -> tuple[int | None, str]:
    """(rank or None for the agent, the line without its prefix).

    torch prefixes a worker's uncaught-exception lines with `[rankN]:` itself, so those arrive
    as `[rankN]:[rankN]: ...`; both prefixes go. Under Ray, the driver puts its own
    `(RayTrainWorker pid=N)` tag (maybe coloured) in front, which goes too; horovodrun tags
    lines `[N]<stdout>:`, read as rank N. A multi-node job's lines come as `[NODE rankN]:` and
    its node agents' as `[NODE]: `; the node stays in the combined log only.
    """
    line = _RAY_TAG.sub("", line, count=1)
    line = _HOROVOD_TAG.sub(r"[rank\1]:", line, count=1)
    m = _PREFIX.match(line)
    if not m:
        return None, _NODE_TAG.sub("", line, count=1)
    rank, text = int(m.group(1)), m.group(2)
    own = f"[rank{rank}]:"
    if text.startswith(own):
        text = text[len(own):].removeprefix(" ")
    return rank, text


class LogSink:
    """Writes the combined log, per-rank logs and the agent log; keeps recent lines per rank."""

    def __init__(self, job_dir: Path, world_size: int = 0):
        self.dir = job_dir / "logs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.combined: IO[str] = open(  # noqa: SIM115
            job_dir / "job.log", "a", buffering=1, encoding="utf-8", errors="replace")
        self.files: dict[int | None, IO[str]] = {}
        self.tails: dict[int | None, deque[str]] = {}
        for rank in range(world_size):  # a rank that never prints still has a (empty) log
            self._file(rank)

    def write(self, line: str) -> tuple[int | None, str]:
        rank, text = split_line(line)
        self.combined.write(line if line.endswith("\n") else line + "\n")
        self._file(rank).write(text if text.endswith("\n") else text + "\n")
        self.tails.setdefault(rank, deque(maxlen=TAIL_LINES)).append(text.rstrip("\n"))
        return rank, text

    def _file(self, rank: int | None) -> IO[str]:
        f = self.files.get(rank)
        if f is None:
            name = "agent.log" if rank is None else f"rank{rank}.log"
            f = self.files[rank] = open(  # noqa: SIM115
                self.dir / name, "a", buffering=1, encoding="utf-8", errors="replace")
        return f

    def new_run(self, note: str) -> None:
        """Workers start again (a restart or a resize): mark it in the logs and forget the old
        run's tails, so the next failure is read from the new run's lines only."""
        line = f"----- gpufleet: {note} -----\n"
        self.combined.write(line)
        for f in self.files.values():
            f.write(line)
        self.tails.clear()

    def tail(self, rank: int | None) -> list[str]:
        return list(self.tails.get(rank, ()))

    def failure_tail(self) -> tuple[int | None, int | None, list[str]]:
        """(the rank that failed first, its exit code, its last 8 lines: the agent's when no
        rank can be blamed)."""
        rank, rank_code = failed_rank(self.tail(None), self.tails)
        last = self.tail(rank)[-8:] if rank is not None else self.tail(None)[-8:]
        return rank, rank_code, last

    def close(self) -> None:
        self.combined.close()
        for f in self.files.values():
            f.close()


_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)\b(?::.*)?$")


def last_exception(lines: list[str]) -> str | None:
    """The final 'SomeError: message' line of a Python traceback, if the lines hold one."""
    for line in reversed(lines):
        if _EXCEPTION.match(line.strip()):
            return line.strip()
    return None


_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
# A rank that died because a peer vanished shows one of these; it is a victim, not the cause.
_KNOCK_ON = re.compile(r"Connection closed by peer|Connection reset|DistBackendError|"
                       r"DistNetworkError|Broken pipe|NCCL communicator was aborted", re.IGNORECASE)


def _exit_codes(agent_lines: list[str]) -> tuple[dict[int, int], int | None]:
    """Per-rank exit codes from torchrun's failure summary, and its 'root cause' rank."""
    codes: dict[int, int] = {}
    root: int | None = None
    in_root = False
    rank: int | None = None
    for line in agent_lines:
        if "Root Cause" in line:
            in_root = True
        if m := _RANK.match(line):
            rank = int(m.group(1))
            if in_root and root is None:
                root = rank
        elif (m := _EXIT.match(line)) and rank is not None:
            codes.setdefault(rank, int(m.group(1)))
    return codes, root


def failed_rank(agent_lines: list[str],
                rank_tails: dict[int | None, deque[str]]) -> tuple[int | None, int | None]:
    """(rank, exit code) of the failure that caused the others.

    torchrun's 'root cause' is only the first exit it observed, often a rank that died because
    its peer did. So: first a rank whose traceback is not a communication knock-on, then
    torchrun's root cause, then any rank with a traceback.
    """
    codes, root = _exit_codes(agent_lines)
    with_tb = [r for r, lines in sorted(rank_tails.items(), key=lambda kv: kv[0] or 0)
               if r is not None and any("Traceback" in ln for ln in lines)]
    primary = [r for r in with_tb if not any(_KNOCK_ON.search(ln) for ln in rank_tails[r])]
    rank = primary[0] if primary else root if root is not None else with_tb[0] if with_tb else None
    return rank, codes.get(rank) if rank is not None else None


def pump(stdout: IO[bytes], sink: LogSink, echo: Callable[[int | None, str], None] | None,
         stopping: Callable[[], bool]) -> None:
    """Copy the workers' combined output into the logs until it ends, echoing each line (with
    its rank) to `echo` unless the job is being stopped."""
    for raw in iter(stdout.readline, b""):
        # Keep draining whatever happens below: a full pipe would stall every worker.
        try:
            rank, text = sink.write(raw.decode("utf-8", "replace"))
        except OSError:  # disk full: the line is lost, the job goes on
            continue
        # after a stop, torchrun's own shutdown traceback is noise: it stays in the logs only
        if echo is not None and not stopping():
            try:
                echo(rank, text.rstrip("\n"))
            except Exception:  # the terminal went away (`| head`, closed pipe): stop echoing
                echo = None
