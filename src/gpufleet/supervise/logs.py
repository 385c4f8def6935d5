"""Splitting torchrun's combined output into one log per rank.

torchrun (with `--tee` and our prefix template) prefixes each worker line with `[rankN]:`; its
own lines (the elastic agent's) have no prefix and go to the agent log.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO

from gpufleet.launch.warm_restart import parked_code
from gpufleet.supervise.blame import (
    ErrorRecord,
    Summary,
    Tail,
    blame,
    in_summary,
    parse,
    signalled,
    summary,
)

_RAY_TAG = re.compile(r"^(?:\x1b\[[0-9;]*m)?\([A-Za-z_]\w* pid=\d+(?:, ip=[^)]*)?\)(?:\x1b\[[0-9;]*m)? ")
_HOROVOD_TAG = re.compile(r"^\[(\d+)\]<std(?:out|err)>:")  # horovodrun's own rank tag
_PREFIX = re.compile(r"^\[(?:[\w.-]+ )?rank(\d+)\]:(.*)$", re.DOTALL)
_NODE_TAG = re.compile(r"^\[[\w.-]+\]: ")  # a node agent's own line, from the Ray driver
TAIL_LINES = 40
SUMMARY_LINES = 4_000  # the summary lines of a run: 4 or 5 per failed rank
PINNED_LINES = 3  # of a traceback scrolled out of the tail: its last frame and its exception
# A traceback stays pinned only this many lines after it: enough for what a script printed just
# before it raised, while one it handled long ago (logging.exception) is not taken for a crash.
PIN_HORIZON = 200
_TRACEBACK = "Traceback (most recent call last)"
_MAX_TRACEBACK = 400  # lines; longer, it is not followed (the error records still have it)


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


class RankTail:
    """A rank's last lines, and its latest traceback even once later output pushed it out.

    torchrun's `--tee` interleaves a rank's stdout and stderr, so lines a script printed just
    before raising (nanoGPT's `Overriding: ...`) often come after its traceback; a bounded tail
    would then hold no traceback at all, and the diagnosis would read the peers' closed
    connections as the cause. Iterating yields the traceback's first line and its last
    PINNED_LINES first, when it scrolled out (less than PIN_HORIZON lines ago), then the tail.
    """

    def __init__(self, size: int = TAIL_LINES) -> None:
        self.lines: deque[str] = deque(maxlen=size)
        self.count = 0  # lines appended in all
        self.traceback: tuple[str, ...] = ()  # the latest complete one
        self._traceback_at = 0  # the count at its first line
        self._capture: list[str] | None = None
        self._capture_at = 0

    def append(self, line: str) -> None:
        self.lines.append(line)
        self.count += 1
        if _TRACEBACK in line:
            self._capture, self._capture_at = [line], self.count - 1
        elif self._capture is not None:
            self._capture.append(line)
            if _EXCEPTION.match(line.strip()):
                self.traceback, self._traceback_at = tuple(self._capture), self._capture_at
                self._capture = None
            elif len(self._capture) > _MAX_TRACEBACK:
                self._capture = None

    def __iter__(self) -> Iterator[str]:
        lines = list(self.lines)
        return iter(self._pinned(len(lines)) + lines)

    def _pinned(self, kept: int) -> list[str]:
        if self.traceback and self.count - PIN_HORIZON <= self._traceback_at < self.count - kept:
            return [self.traceback[0], *self.traceback[1:][-PINNED_LINES:]]
        return []

    def __len__(self) -> int:
        return len(self._pinned(len(self.lines))) + len(self.lines)


class LogSink:
    """Writes the combined log, per-rank logs and the agent log; keeps recent lines per rank."""

    def __init__(self, job_dir: Path, world_size: int = 0):
        self.job_dir = job_dir
        self.run_since: float | None = None  # when this run's workers started (error records)
        self.dir = job_dir / "logs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.combined: IO[str] = open(  # noqa: SIM115
            job_dir / "job.log", "a", buffering=1, encoding="utf-8", errors="replace")
        self.files: dict[int | None, IO[str]] = {}
        self.tails: dict[int | None, RankTail] = {}
        # torchrun's failure summaries of this run (every node's), which outgrow the agent's tail
        self.summaries: deque[str] = deque(maxlen=SUMMARY_LINES)
        # a node driver's `NodeLostError: ...` of this run, which the nodes' last words (their
        # torchrun's summaries, drained as they end) can push out of the agent's tail
        self.lost: str | None = None
        for rank in range(world_size):  # a rank that never prints still has a (empty) log
            self._file(rank)

    def write(self, line: str) -> tuple[int | None, str]:
        rank, text = split_line(line)
        self.combined.write(line if line.endswith("\n") else line + "\n")
        self._file(rank).write(text if text.endswith("\n") else text + "\n")
        self.tails.setdefault(rank, RankTail()).append(text.rstrip("\n"))
        if rank is None and in_summary(text):
            self.summaries.append(text.rstrip("\n"))
        if rank is None and text.startswith("NodeLostError"):
            self.lost = text.rstrip("\n")
        return rank, text

    def _file(self, rank: int | None) -> IO[str]:
        f = self.files.get(rank)
        if f is None:
            name = "agent.log" if rank is None else f"rank{rank}.log"
            f = self.files[rank] = open(  # noqa: SIM115
                self.dir / name, "a", buffering=1, encoding="utf-8", errors="replace")
        return f

    def run_started(self, now: float) -> None:
        """A run of the workers starts now: its error records are the files written after."""
        self.run_since = now

    def new_run(self, note: str) -> None:
        """Workers start again (a restart or a resize): mark it in the logs and forget the old
        run's tails, so the next failure is read from the new run's lines only."""
        line = f"----- gpufleet: {note} -----\n"
        self.combined.write(line)
        for f in self.files.values():
            f.write(line)
        self.tails.clear()
        self.summaries.clear()
        self.lost = None

    def tail(self, rank: int | None) -> list[str]:
        return list(self.tails.get(rank, ()))

    def agent_lines(self) -> list[str]:
        """The agent's recent lines, after this run's NodeLostError line however far back it
        is (backends' `node_lost` looks for it)."""
        return [*([self.lost] if self.lost else []), *self.tail(None)]

    def failure_tail(self) -> tuple[int | None, int | None, list[str]]:
        """(the rank that failed first, its exit code, its last 8 lines: the agent's when no
        rank can be blamed), read from the logs alone."""
        rank, rank_code = failed_rank(list(self.summaries), self.tails)
        last = self.tail(rank)[-8:] if rank is not None else self.tail(None)[-8:]
        return rank, rank_code, last

    def failure(self, single_node: bool) -> Tail:
        """How this run's failure reads: from the ranks' error records when one names the cause
        (see blame.py), else from the log tails. `single_node`: a record's folder (torchrun's
        local rank) is its global rank."""
        told = summary(self.summaries)
        found = blame(self.error_records(told, single_node), told.codes)
        if found is not None:
            return Tail(found.rank, found.code, found.lines, found.error, recorded=True)
        rank, rank_code, last = self.failure_tail()
        held = self.tails.get(rank)
        error = last_exception(list(held.traceback)) if held is not None and held.traceback \
            and rank is not None else None
        return Tail(rank, rank_code, tuple(last), error or last_exception(last))

    def error_records(self, found: Summary, single_node: bool) -> list[ErrorRecord]:
        """The error files torchrun's workers wrote in this run (under the job's `--log-dir`:
        torchrun/<run id>/attempt_N/<local rank>/error.json), written since it started."""
        records: list[ErrorRecord] = []
        if self.run_since is None:
            return records
        for path in sorted((self.job_dir / "torchrun").glob("*/attempt_*/*/error.json")):
            try:
                if path.stat().st_mtime < self.run_since:
                    continue  # an earlier run's
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # being written, or not JSON: the logs still tell
            rank = found.files.get(str(path))
            if rank is None and single_node and path.parent.name.isdigit():
                rank = int(path.parent.name)
            record = parse(data, rank) if isinstance(data, dict) else None
            if record is not None:
                records.append(record)
        return records

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


# A rank that died because a peer vanished shows one of these; it is a victim, not the cause.
_KNOCK_ON = re.compile(r"Connection closed by peer|Connection reset|DistBackendError|"
                       r"DistNetworkError|Broken pipe|NCCL communicator was aborted", re.IGNORECASE)


_TORCHRUNS_SIGTERM = (-15, 143)  # how torchrun ends the other ranks: -N, or a shell's 128+N


def failed_rank(agent_lines: list[str],
                rank_tails: Mapping[int | None, Iterable[str]]) -> tuple[int | None, int | None]:
    """(rank, exit code) of the failure that caused the others.

    torchrun's 'root cause' is only the first exit it observed, often a rank that died because
    its peer did. So: first a rank whose traceback is not a communication knock-on, then a
    root cause that shows no knock-on (a multi-node job has one per node: a rank that ended
    with `sys.exit(1)` on one node, its peer's "Connection closed by peer" on another), then
    any rank that exited with a code of its own (not a signal) and shows no knock-on (the
    `sys.exit(1)` listed among a node's other failures, behind a victim's root cause), then
    any rank ended by a signal torchrun does not send (SIGKILL from outside, SIGSEGV, SIGABRT;
    torchrun ends the survivors with SIGTERM) and shows no knock-on (a kill -9 whose peer raised
    on the closed connection and was recorded, by its timestamp, as torchrun's root cause), then
    torchrun's first root cause, then any rank with a traceback.
    """
    found = summary(agent_lines)
    codes, root = found.codes, found.root
    tails = {r: list(lines) for r, lines in rank_tails.items()}

    def knocked_on(r: int) -> bool:
        return any(_KNOCK_ON.search(ln) for ln in tails.get(r, ()))

    with_tb = [r for r, lines in sorted(tails.items(), key=lambda kv: kv[0] or 0)
               if r is not None and any("Traceback" in ln for ln in lines)]
    primary = [r for r in with_tb if not knocked_on(r)]
    unhurt = [(r, code) for r, code in sorted(codes.items()) if not knocked_on(r)]
    clean = [r for r in found.roots if not knocked_on(r)] or \
        [r for r, code in unhurt if not signalled(code)] or \
        [r for r, code in unhurt if signalled(code) and code not in _TORCHRUNS_SIGTERM]
    rank = (primary[0] if primary else clean[0] if clean else root
            if root is not None else with_tb[0] if with_tb else None)
    return rank, codes.get(rank) if rank is not None else None


def pump(stdout: IO[bytes], sink: LogSink, echo: Callable[[int | None, str], None] | None,
         stopping: Callable[[], bool], parked: Callable[[int], None] | None = None) -> None:
    """Copy the workers' combined output into the logs until it ends, echoing each line (with
    its rank) to `echo` unless the job is being stopped. A warm launcher's line saying its
    workers ended and it waits (launch/warm_restart.py) goes to `parked` with its exit code:
    every line the workers printed is in the logs by then."""
    for raw in iter(stdout.readline, b""):
        # Keep draining whatever happens below: a full pipe would stall every worker.
        try:
            rank, text = sink.write(raw.decode("utf-8", "replace"))
        except OSError:  # disk full: the line is lost, the job goes on
            continue
        code = parked_code(text) if parked is not None and rank is None else None
        if code is not None and parked is not None:
            parked(code)
            continue
        # after a stop, torchrun's own shutdown traceback is noise: it stays in the logs only
        if echo is not None and not stopping():
            try:
                echo(rank, text.rstrip("\n"))
            except Exception:  # the terminal went away (`| head`, closed pipe): stop echoing
                echo = None
