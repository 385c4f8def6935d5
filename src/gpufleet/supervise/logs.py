"""Splitting torchrun's combined output into one log per rank.

torchrun (with `--tee` and our prefix template) prefixes each worker line with `[rankN]:`; its
own lines (the elastic agent's) have no prefix and go to the agent log.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path
from typing import IO

_PREFIX = re.compile(r"^\[rank(\d+)\]:(.*)$", re.DOTALL)
TAIL_LINES = 40


def split_line(line: str) -> tuple[int | None, str]:
    """(rank or None for the agent, the line without its prefix)."""
    m = _PREFIX.match(line)
    return (int(m.group(1)), m.group(2)) if m else (None, line)


class LogSink:
    """Writes the combined log, per-rank logs and the agent log; keeps recent lines per rank."""

    def __init__(self, job_dir: Path):
        self.dir = job_dir / "logs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.combined: IO[str] = open(job_dir / "job.log", "a", buffering=1)  # noqa: SIM115
        self.files: dict[int | None, IO[str]] = {}
        self.tails: dict[int | None, deque[str]] = {}

    def write(self, line: str) -> tuple[int | None, str]:
        rank, text = split_line(line)
        self.combined.write(line if line.endswith("\n") else line + "\n")
        f = self.files.get(rank)
        if f is None:
            name = "agent.log" if rank is None else f"rank{rank}.log"
            f = self.files[rank] = open(self.dir / name, "a", buffering=1)  # noqa: SIM115
        f.write(text if text.endswith("\n") else text + "\n")
        self.tails.setdefault(rank, deque(maxlen=TAIL_LINES)).append(text.rstrip("\n"))
        return rank, text

    def tail(self, rank: int | None) -> list[str]:
        return list(self.tails.get(rank, ()))

    def close(self) -> None:
        self.combined.close()
        for f in self.files.values():
            f.close()


_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def failed_rank(agent_lines: list[str],
                rank_tails: dict[int | None, deque[str]]) -> tuple[int | None, int | None]:
    """(rank, exit code) of the root-cause failure from torchrun's summary, else the first rank
    whose output holds a traceback."""
    rank = code = None
    for line in agent_lines:
        if rank is None and (m := _ROOT_RANK.match(line)):
            rank = int(m.group(1))
        if code is None and (m := _EXIT.match(line)):
            code = int(m.group(1))
    if rank is None:
        for r, lines in sorted(rank_tails.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            if r is not None and any("Traceback" in ln or "Error" in ln for ln in lines):
                rank = r
                break
    return rank, code
