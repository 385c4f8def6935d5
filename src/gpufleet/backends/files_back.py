"""Files a node wrote under the job folder, carried back to the driver on the node's own output.

A node that does not see the submitter's job folder (every SSH host; a Ray or Slurm node the
probe found unseen) has torchrun write its per-rank logs and error records (`error.json`,
bootstrap/errorfile.py) on the node's own disk. The driver already reads each node's lines (an
ssh session, an srun step, a Ray agent's `drain`), so the files ride on that same stream, one
framed line each after the node's last output, and the driver writes them into the job folder
at the path they have there: `status` and the failure reason (supervise/blame.py) then read
them as on the local pool, and nothing reads a node's disk afterwards.

Engine-neutral: the SSH node (ssh_node), the Ray and Slurm agent (node_agent.NodeAgent) and
their drivers all use it.
"""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path

FRAME = "\x1egpufleet-file "  # starts a line that carries a file back, not a log line
MAX_FILE_BYTES = 4 * 2**20  # a file larger than this comes back as its last 4 MiB
SENT = "torchrun"  # the folder under the job folder that comes back: torchrun's --log-dir


def frame(rel: str, data: bytes) -> str:
    """One line carrying a file (its path relative to the job folder) back to the driver."""
    return FRAME + json.dumps({"path": rel, "b64": base64.b64encode(data).decode()})


def unframe(line: str) -> tuple[str, bytes] | None:
    """The (relative path, content) a framed line carries; None for a log line. A path that
    would leave the job folder (absolute, `..`) is refused as None."""
    if not line.startswith(FRAME):
        return None
    try:
        rec = json.loads(line[len(FRAME):])
        rel, data = str(rec["path"]), base64.b64decode(rec["b64"])
    except (ValueError, KeyError, TypeError):
        return None
    if not rel or rel.startswith("/") or ".." in Path(rel).parts:
        return None
    return rel, data


def framed(job_dir: Path, since: float = 0.0) -> list[str]:
    """Every plain file under `job_dir`'s `torchrun/` modified at or after `since` (seconds
    since the epoch: an earlier run's files left on the node are not this run's), as framed
    lines in path order; a file over MAX_FILE_BYTES as its last MAX_FILE_BYTES (a log's end
    is what tells)."""
    out: list[str] = []
    base = job_dir / SENT
    for path in sorted(base.rglob("*")) if base.is_dir() else []:
        if path.is_symlink() or not path.is_file():
            continue
        with contextlib.suppress(OSError), path.open("rb") as f:
            size = path.stat()
            if size.st_mtime < since:
                continue
            f.seek(max(0, size.st_size - MAX_FILE_BYTES))
            out.append(frame(path.relative_to(job_dir).as_posix(), f.read()))
    return out


def write_back(job_dir: Path, line: str) -> bool:
    """If `line` carries a file, write it into `job_dir` at its relative path (a file that
    cannot be written is dropped: the log lines still tell) and say True; False for a log
    line, which the caller prints."""
    got = unframe(line)
    if got is None:
        return False
    dest = job_dir / got[0]
    with contextlib.suppress(OSError):
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(got[1])
    return True
