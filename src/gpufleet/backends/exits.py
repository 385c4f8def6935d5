"""What a multi-node driver (Ray's, Slurm's) tells the supervisor's backend object when a run
lost a node: a meaningful exit code, a `NodeLostError:` line, and the lost nodes in a file
beside the run's plan (`PLAN.lost`), read once by the heal."""

from __future__ import annotations

import json
from pathlib import Path

NODE_LOST_EXIT = 75  # EX_TEMPFAIL: a node left mid-job; the job may run again on other nodes


def lost_line(code: int, lines: list[str]) -> str | None:
    """The driver's `NodeLostError: ...` line, if it exited NODE_LOST_EXIT."""
    if code != NODE_LOST_EXIT:
        return None
    return next((ln for ln in reversed(lines) if ln.startswith("NodeLostError")), None)


def take_lost(plan_path: Path) -> set[str]:
    """The nodes the driver named lost beside `plan_path`, and the file removed: a second call
    says none."""
    lost_file = plan_path.with_suffix(".lost")
    try:
        lost = {str(n) for n in json.loads(lost_file.read_text())}
        lost_file.unlink()
    except (OSError, ValueError, TypeError):
        return set()
    return lost
