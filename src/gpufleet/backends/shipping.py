"""Whether a run's nodes see this machine's files, detected rather than assumed (issue 29).

An engine whose nodes may be other machines implements `SharesFiles` beside `Backend`: `sees`
asks each node whether it reads exactly this content at this path. The decision is the same for
every engine (`decide`): the workdir and the results travel iff some node of the run does not
see a probe file written where the job's folders live. The loopback test Ray and Slurm, and a
site whose nodes mount one file system, see it: nothing is shipped there. An engine without
`SharesFiles` runs on this host only (local, fake), where the question does not arise.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

PROBE_PREFIX = ".gpufleet-probe-"
PROBE_TIMEOUT_S = 60.0  # the most one `sees` may take; a node that has not answered by then
#                         counts as not seeing (it cannot be relied on to read the job's files)


@runtime_checkable
class SharesFiles(Protocol):
    """An engine that can tell whether its nodes read this machine's files."""

    def sees(self, node_ids: Sequence[str], path: Path, content: str,
             ref: str = "") -> dict[str, bool]:
        """For each of `node_ids` (the pool's node ids), whether that node reads exactly
        `content` at `path`. `ref`: the cluster's allocation in an engine that allocates (a
        Slurm job id, whose nodes only its steps reach). One exchange with the engine that
        blocks at most PROBE_TIMEOUT_S; a node that does not answer is False."""
        ...


@dataclass(frozen=True)
class Sharing:
    """What the probe found: each node of the run and whether it saw the file."""

    seen: Mapping[str, bool]

    @property
    def unseen(self) -> tuple[str, ...]:
        return tuple(n for n, saw in self.seen.items() if not saw)

    @property
    def ships(self) -> bool:
        """The workdir travels to the nodes and checkpoints stay node-local."""
        return bool(self.unseen)


def decide(node_ids: Sequence[str], answers: Mapping[str, bool]) -> Sharing:
    """The run's nodes in order, each seen only if its answer says so (pure): a node the
    engine did not answer for counts as not seeing."""
    return Sharing({n: bool(answers.get(n, False)) for n in node_ids})


def probe(engine: object, node_ids: Sequence[str], folder: Path, ref: str = "") -> Sharing | None:
    """Write a probe file with fresh random content in `folder`, ask the engine whether each
    node reads it, remove it. None: the engine has no `SharesFiles` (it runs on this host)."""
    if not isinstance(engine, SharesFiles):
        return None
    content = secrets.token_hex(16)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{PROBE_PREFIX}{content[:12]}"
    path.write_text(content)
    try:
        return decide(node_ids, engine.sees(node_ids, path, content, ref))
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def read_file_is(path: str, content: str) -> bool:
    """On a node: whether it reads exactly `content` at `path` (what a Ray task runs)."""
    try:
        with open(path) as f:
            return f.read() == content
    except OSError:
        return False
