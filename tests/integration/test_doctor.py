"""`gpufleet doctor` for real on this host: a real gloo all-reduce on 2 CPU workers, the exit code
consistent with the JSON, a broken NCCL setting, a launched CPU cluster, and bad cluster names.

Each run is a subprocess with its own $GPUFLEET_HOME (the `fleet` fixture), which also fails the
test if the all-reduce left any process behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from fleet_helpers import CLI, Fleet, error_lines

# `gpufleet doctor`, and the module entry point that runs the same `doctor()` without Typer.
ENTRY_POINTS = {"cli": [*CLI, "doctor"], "module": [sys.executable, "-m", "gpufleet.doctor.command"]}


def doctor(fleet: Fleet, *args: str, entry: str = "cli", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRY_POINTS[entry], *args], env=fleet.env(**env), cwd=fleet.cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [node] = report["nodes"]
    return {c["name"]: c for c in node["checks"]}


def test_doctor_on_this_host(fleet: Fleet) -> None:
    r = doctor(fleet, "--json")
    report = json.loads(r.stdout)
    failed = report["summary"]["failed"]
    assert report["ok"] == (failed == 0)
    assert r.returncode == (1 if failed else 0), r.stdout + r.stderr
    checks = by_name(report)
    assert list(checks) == ["devices", "versions", "bf16", "topology", "nccl-env", "shm",
                            "open-files", "disk", "all-reduce", "state-file"]
    assert checks["state-file"]["status"] == "pass", checks["state-file"]
    assert sum(report["summary"].values()) == len(checks)
    for c in checks.values():
        assert c["status"] in ("pass", "warn", "fail")
        assert (c["fix"] == "") == (c["status"] == "pass"), c
    ar = checks["all-reduce"]
    assert ar["status"] == "pass", ar
    assert ar["data"]["workers"] == 2 and ar["data"]["sum"] == 3
    assert ar["data"]["busbw_gbps"] > 0
    assert str(fleet.home) in checks["disk"]["detail"]


def test_missing_nccl_interface_fails_with_the_fix(fleet: Fleet) -> None:
    r = doctor(fleet, NCCL_SOCKET_IFNAME="nosuchif0")
    assert r.returncode == 1, r.stdout + r.stderr
    row = [ln for ln in r.stdout.splitlines() if "nccl-env" in ln]
    assert row and "FAIL" in row[0]
    assert "nosuchif0" in r.stdout and "unset" in r.stdout  # the detail and the fix
    assert r.stdout.rstrip().splitlines()[-1].endswith(" 1 failed")


def test_doctor_on_a_cpu_cluster(fleet: Fleet) -> None:
    fleet.ok("launch", "--gpu", "cpu", "--count", "2", "--name", "c1", "-y")
    r = doctor(fleet, "--cluster", "c1", "--json")
    report = json.loads(r.stdout)
    assert report["nodes"][0]["cluster"] == "c1"
    checks = by_name(report)
    assert checks["devices"]["status"] == "pass", checks["devices"]
    assert "cluster c1 holds cpu0, cpu1" in checks["devices"]["detail"]
    assert checks["all-reduce"]["status"] == "pass", checks["all-reduce"]
    [row] = fleet.clusters()  # doctor reserved nothing and changed nothing
    assert row["name"] == "c1" and row["devices"] == ["cpu0", "cpu1"] and row["job"] is None

    fleet.ok("stop", "c1")
    r = doctor(fleet, "--cluster", "c1")
    assert r.returncode == 2
    [err] = error_lines(r.stderr)
    assert "stopped" in err and "Traceback" not in r.stderr


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_unknown_cluster_is_one_line_and_exit_2(fleet: Fleet, entry: str) -> None:
    r = doctor(fleet, "--cluster", "nope", "--json", entry=entry)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == error_lines(r.stderr)
    assert "no cluster named 'nope'" in r.stderr and "Traceback" not in r.stderr
