"""The keeper's `--after` command runs once the tree has ended, however it ended: the launcher's
own exit (with its status kept), the supervisor's death (the lifeline closed), or a stop that
killed the launcher after its grace (backends/proc_tree.py). This is what removes a job's
container when its runtime client is killed (launch/container.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.backends import keeper, proc_tree
from gpufleet.launch.run_env import identity_env
from gpufleet.lifecycle import leftovers


def _after(mark: Path) -> list[str]:
    return [sys.executable, "-c", f"open({str(mark)!r}, 'w').write('done')"]


def _wait_started(started: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until the launcher wrote `started` (an event, up to 2 minutes on a loaded host)."""
    for _ in range(1200):
        if started.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert started.exists()


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
        _wait_started(started, proc)
    finally:
        os.close(lifeline)  # as if the supervisor died: the keeper ends the tree
    proc.wait(timeout=60)
    assert mark.read_text() == "done"


def test_a_tree_ended_past_its_grace_still_runs_the_keepers_after(tmp_path: Path) -> None:
    """A launcher that outlasts the grace (it ignores SIGTERM, as a job saving a checkpoint
    on the way out does) is killed; the keeper is not, so its slow clean-up still runs to the
    end (the container's removal: killed with the rest, the keeper left it on the node)."""
    mark = tmp_path / "after"
    started = tmp_path / "started"
    slow_after = [sys.executable, "-c",
                  f"import time; time.sleep(2); open({str(mark)!r}, 'w').write('done')"]
    script = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"open({str(started)!r}, 'w').close(); time.sleep(600)")
    proc, lifeline = keeper.spawn([sys.executable, "-c", script], os.environ, tmp_path,
                                  after=slow_after)
    try:
        _wait_started(started, proc)

        def wait(timeout: float) -> int | None:
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None

        code = proc_tree.end_kept(proc.pid, wait, grace_s=0.5)
    finally:
        os.close(lifeline)
    assert code == -signal.SIGKILL  # the keeper exits as its launcher did: killed
    assert mark.read_text() == "done"


def test_a_launcher_killed_by_sigkill_is_read_as_such_through_the_keeper(tmp_path: Path) -> None:
    """The keeper re-raises its launcher's signal; SIGKILL's action cannot be set, and trying
    made the keeper exit 1 with a traceback in the run's log instead."""
    proc, lifeline = keeper.spawn([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"],
                                  os.environ, tmp_path)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(lifeline)
    assert proc.returncode == -signal.SIGKILL
    assert b"Traceback" not in out


def test_a_reconcile_just_after_the_supervisors_death_lets_the_keeper_clean_up(
        tmp_path: Path) -> None:
    """A command run while the keeper is still removing the container (the supervisor's kill
    -9 a moment before) ends the run's leftovers: it waits for the keeper rather than
    signalling it and its `--after`, which carry the run's identity as well."""
    mark = tmp_path / "after"
    started = tmp_path / "started"
    cleaning = tmp_path / "cleaning"
    run = leftovers.RunIdentity("j", str(tmp_path), 2**22 + 7)  # a supervisor no longer there
    env = {**os.environ, **identity_env(run.job_name, run.job_dir, run.supervisor_pid)}
    slow_after = [sys.executable, "-c",
                  f"import time; open({str(cleaning)!r}, 'w').close(); time.sleep(4); "
                  f"open({str(mark)!r}, 'w').write('done')"]
    script = f"import time; open({str(started)!r}, 'w').close(); time.sleep(600)"
    proc, lifeline = keeper.spawn([sys.executable, "-c", script], env, tmp_path, after=slow_after)
    try:
        _wait_started(started, proc)
    finally:
        os.close(lifeline)  # the supervisor died: the keeper ends the tree, then cleans up
    for _ in range(1200):
        if cleaning.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert cleaning.exists()
    ended = leftovers.end_run(run)  # the reconcile comes while the clean-up runs
    assert proc.pid in ended
    assert mark.read_text() == "done"
    assert proc.wait(timeout=60) is not None
