"""The keeper's `--after` command runs once the tree has ended, however it ended: the launcher's
own exit (with its status kept), or the supervisor's death (the lifeline closed). This is what
removes a job's container when its runtime client is killed (launch/container.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gpufleet.backends import keeper


def _after(mark: Path) -> list[str]:
    return [sys.executable, "-c", f"open({str(mark)!r}, 'w').write('done')"]


def test_after_runs_when_the_launcher_exits_and_the_status_is_kept(tmp_path: Path) -> None:
    mark = tmp_path / "after"
    proc, lifeline = keeper.spawn([sys.executable, "-c", "raise SystemExit(7)"], os.environ,
                                  tmp_path, after=_after(mark))
    try:
        assert proc.wait(timeout=60) == 7
    finally:
        os.close(lifeline)
    assert mark.read_text() == "done"


def test_after_runs_when_the_supervisor_is_gone(tmp_path: Path) -> None:
    mark = tmp_path / "after"
    started = tmp_path / "started"
    script = f"import time; open({str(started)!r}, 'w').close(); time.sleep(600)"
    proc, lifeline = keeper.spawn([sys.executable, "-c", script], os.environ, tmp_path,
                                  after=_after(mark))
    try:
        for _ in range(1200):  # waits on the file the launcher writes, up to 2 minutes
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert started.exists()
    finally:
        os.close(lifeline)  # as if the supervisor died: the keeper ends the tree
    proc.wait(timeout=60)
    assert mark.read_text() == "done"
