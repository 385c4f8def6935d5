"""Each diagnosis, provoked by a real job on CPU workers, is found and shown with its fix.

tests/unit/test_diagnose.py pins the rules' thresholds on synthetic series; these runs show the
whole path works: the worker SDK measures, the supervisor samples and diagnoses, the store keeps
the finding, `status --json` and the events report it.

The speed rules judge medians of recorded series against thresholds (a straggler is 1.25x its
peers' busy time), and CI runs two modules on two cores, so every provoked effect here is many
times its threshold: a busy machine can slow any rank, but not by a factor. A stall is held until
the test has seen it diagnosed (a gate file), since the supervisor diagnoses only every 5 s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import WORKERS, Fleet

JOB = str(WORKERS / "telemetry_job.py")

CASES: list[tuple[str, list[str], list[str], dict[str, str], str, str, str]] = [
    # (id, gpufleet run options, script args, env, rule, severity, words in the detail)
    ("data", [], ["--steps", "150", "--data-delay", "0.06"], {}, "data_loading", "warning",
     "wait"),
    ("oom", [], ["--steps", "100", "--oom-after", "5"], {}, "memory", "critical",
     "can't allocate memory"),
    ("timeout", [], ["--steps", "100", "--timeout-after", "5", "--pg-timeout", "3"], {},
     "comm_timeout", "critical", "Timed out"),
    # rank 1 sleeps 0.2 s a step where its peer computes in about 2 ms (idle) to 40 ms (loaded):
    # at least 5x, against a threshold of 1.25x
    ("straggler", [], ["--steps", "80", "--straggle", "0.2"], {}, "straggler", "warning",
     "Rank 1"),
    ("fp16", ["--precision", "fp16-mixed"], ["--steps", "200", "--lr", "1e4"], {}, "precision",
     "warning", "non-finite loss"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_provoked_problem_is_diagnosed(fleet: Fleet, case: tuple[Any, ...]) -> None:
    name, options, script_args, env, rule, severity, words = case
    r = fleet("run", JOB, "--gpu", "cpu", "--count", "2", "--name", name, "-y", *options, "--",
              *script_args, timeout=150, env=env)
    status = fleet.status(name)
    found = {f["rule"]: f for f in status["findings"]}
    assert rule in found, f"{rule} not found in {status['findings']}\n{r.stdout[-2000:]}"
    f = found[rule]
    assert f["severity"] == severity
    assert words in f["detail"] and f["fix"]
    # the finding's first appearance is an event of the job's history
    assert any(e["kind"] == "diagnosis" and f["title"] in e["reason"] for e in status["events"])


def test_a_stall_is_diagnosed_while_it_lasts(fleet: Fleet, tmp_path: Path) -> None:
    """Every rank stops reporting after step 10 until the test has seen the job diagnosed as
    stalled (4 s without a step is a stall here); then the job goes on and succeeds."""
    gate = tmp_path / "go"
    r = fleet("run", "-d", JOB, "--gpu", "cpu", "--count", "2", "--name", "stall", "-y", "--",
              "--steps", "30", "--stall-after", "10", "--stall-gate", str(gate),
              env={"GPUFLEET_STALL_AFTER_S": "4"})
    assert r.returncode == 0, r.stdout + r.stderr

    def stalled(s: dict[str, Any]) -> bool:  # at the gate: a pause elsewhere is not this stall
        return any(f["rule"] == "stalled" and "last step 10" in f["detail"]
                   for f in s.get("findings") or [])

    status = fleet.wait_for("stall", stalled, timeout=150)
    gate.touch()
    f = next(f for f in status["findings"] if f["rule"] == "stalled")
    assert f["severity"] == "critical" and f["fix"]
    assert status["step"] == 10 and status["status"] == "running", status
    done = fleet.wait_ended("stall", timeout=150)
    assert done["status"] == "succeeded" and done["step"] == 30, done
    assert any(e["kind"] == "diagnosis" and f["title"] in e["reason"] for e in done["events"])


def test_poor_scaling_against_a_one_worker_run_of_the_same_script(fleet: Fleet) -> None:
    """Each step of a tiny model also all-reduces a 256 MB buffer (--sync-mb): one worker sets
    the yardstick (milliseconds a step), two then take a third of a second a step or more.
    Poor by a factor, not a margin: on a machine loaded far beyond two CPU burners a lone
    worker's step took 70 ms for 5 ms of work, and a 32 MB buffer then scaled at 66-137%.
    Both runs use one thread a worker, so the yardstick and the pair use the cores alike."""
    args = ["--env", "OMP_NUM_THREADS=1", "--", "--steps", "80", "--batch", "8", "--sync-mb",
            "256"]
    fleet.ok("run", JOB, "--gpu", "cpu", "--count", "1", "--name", "one", "-y", *args,
             timeout=150)
    fleet.ok("run", JOB, "--gpu", "cpu", "--count", "2", "--name", "two", "-y", *args,
             timeout=150)
    found = {f["rule"]: f for f in fleet.status("two")["findings"]}
    assert "scaling" in found, fleet.status("two")
    assert "efficiency" in found["scaling"]["detail"]
    assert fleet.status("one")["findings"] == []  # one worker has nothing to scale


def test_a_healthy_run_has_no_warnings(fleet: Fleet) -> None:
    """The default job (a tiny model in small batches on gloo) is communication-bound; a wider
    model in large batches computes most of each step: nothing to report, no false alarms."""
    fleet.ok("run", JOB, "--gpu", "cpu", "--count", "2", "--name", "fine", "-y", "--",
             "--steps", "100", "--batch", "512", "--dim", "256", "--wide", "1024", timeout=150)
    status = fleet.status("fine")
    warned = [f"{f['rule']}: {f['detail']}" for f in status["findings"] if f["severity"] != "info"]
    # the rules judge speeds: on a failure, say how busy the machine was
    assert warned == [], f"load average {os.getloadavg()}: {warned}"
    text = fleet.ok("status", "fine").stdout
    assert "Devices" in text and "Ranks" in text  # telemetry tables, from the same data
