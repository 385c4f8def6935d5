"""A `gpufleet run` that dies during its start-up leaves nothing reserved (issue 17, finding 2).

The trial: a `run` killed (SIGHUP while it waited for the store's write lock, or kill -9) after
its cluster was recorded but before its supervisor was left `run-xxxx cpu0,cpu1 running` for good,
or a job `starting` with no supervisor holding every slot, so every later run was refused. Here a
real process makes the same calls the CLI makes and SIGKILLs itself at each of those points
(workers/startup_cut.py); the next command must free what it held.
"""

from __future__ import annotations

import subprocess
import sys

from fleet_helpers import WORKERS, Fleet

CUT = str(WORKERS / "startup_cut.py")
SLEEPER = str(WORKERS / "sleeper.py")


def _cut(fleet: Fleet, point: str, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, CUT, point, name, SLEEPER], env=fleet.env(),
                            cwd=fleet.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_run_killed_during_start_up_frees_what_it_reserved(fleet: Fleet) -> None:
    for point in ("reserved", "created"):
        proc = _cut(fleet, point, f"cut-{point}")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -9, err  # it died where we meant it to, not on an error
        # the next command sees the holder gone and frees its cluster (it would stay 'running',
        # holding both slots: every later run refused)
        assert fleet.clusters() == [], point
        if point == "created":
            s = fleet.status("cut-created")
            assert s["status"] == "interrupted", s
            assert "ended before its supervisor started" in s["reason"], s["reason"]


def test_stop_of_a_job_whose_supervisor_never_started_frees_its_cluster(fleet: Fleet) -> None:
    """`stop JOB` on a job still `starting` with no supervisor (its `run` is alive but stuck)
    used to mark it stopped and leave the cluster made for it running."""
    proc = _cut(fleet, "hold", "stuck")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert [c["name"] for c in fleet.clusters()] != []
        assert fleet.status("stuck")["status"] == "starting"
        fleet.ok("stop", "stuck", "-y")
        assert fleet.status("stuck")["status"] == "stopped"
        assert fleet.clusters() == []
    finally:
        proc.kill()  # ours, by pid
        proc.communicate(timeout=10)
