"""Pieces of `--framework ray`'s worker that need no Ray: a script's `sys.exit` status (Ray Train
counts any exception, SystemExit too, as the worker failing), and the supervisor learning a
rank's pid from its first note (a Ray worker's RANK is not in its process environment, so the
CPU sampler finds it only by the pid it reports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.launch.ray_train import ScriptExit, _run_script
from gpufleet.reportauth import Signer, new_key
from gpufleet.store import Cluster, Job
from gpufleet.supervise.events import WorkerNote
from gpufleet.supervise.intake import Intake


@pytest.mark.parametrize("ending", ["", "import sys; sys.exit(0)", "import sys; sys.exit()"])
def test_a_script_that_ends_or_exits_0_succeeds(tmp_path: Path, ending: str) -> None:
    script = tmp_path / "s.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n{ending}\n")
    _run_script(str(script))
    assert (tmp_path / "ran").exists()


def test_a_failing_exit_status_fails_the_worker_and_says_which(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys; sys.exit(3)\n")
    with pytest.raises(ScriptExit, match="status 3"):
        _run_script(str(script))


def test_a_note_names_the_ranks_pid_if_it_is_one_of_the_jobs() -> None:
    key = new_key()
    intake = Intake(Job(name="j"), Cluster(name="c"), key)

    def note(rank: int, pid: int) -> bytes:
        rec = {"t": 1.0, "rank": rank, "event": "ray_worker", "pid": pid}
        return Signer(key).seal(json.dumps(rec).encode())

    assert intake.datagram(note(1, 999), lambda pid: pid != 999) == [WorkerNote("ray_worker", 1, None)]
    assert intake.worker_pids == {}, "a pid that is not the job's is not taken"
    intake.datagram(note(0, 4100), lambda pid: pid != 999)
    intake.datagram(note(1, 4101), lambda pid: pid != 999)
    assert intake.worker_pids == {0: 4100, 1: 4101}
    assert intake.job.step is None, "a note is no progress"
