"""Clusters end to end: launch, list, exec/ssh inside, stop, and launches racing for devices."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fleet_helpers import CLI, Fleet, error_lines


def test_launch_list_exec_ssh_stop(fleet: Fleet) -> None:
    launched = fleet.json("launch", "--gpu", "cpu", "--count", "2", "--name", "alpha", "-y", "--json")
    assert launched["name"] == "alpha"
    assert launched["devices"] == ["cpu0", "cpu1"]

    [row] = fleet.clusters()
    assert row["name"] == "alpha"
    assert row["status"] == "running"
    assert row["gpu"] == "cpu" and row["count"] == 2
    assert row["devices"] == ["cpu0", "cpu1"]
    assert row["usd_per_hour"] > 0
    assert row["cost_usd"] >= 0
    assert row["job"] is None

    # exec: the cluster's environment (CPU devices hide every GPU), in the caller's folder.
    code = ("import os; print(os.environ['CUDA_VISIBLE_DEVICES'] == '', os.environ['GPUFLEET_CLUSTER'],"
            " os.getcwd())")
    r = fleet.ok("exec", "alpha", "--", sys.executable, "-c", code)
    assert r.stdout.split() == ["True", "alpha", str(fleet.cwd)]
    # exec passes the command's exit code through
    r = fleet("exec", "alpha", "--", sys.executable, "-c", "raise SystemExit(7)")
    assert r.returncode == 7, r.stderr

    # ssh -- CMD: runs on the head node, in the cluster's scratch folder
    r = fleet.ok("ssh", "alpha", "--", sys.executable, "-c", "import os; print(os.getcwd())")
    scratch = Path(r.stdout.strip())
    assert scratch == fleet.home / "clusters" / "alpha"
    assert scratch.is_dir()

    # every slot is held: another launch is refused and says what is free
    r = fleet("launch", "--gpu", "cpu", "--count", "1", "--name", "beta", "-y")
    assert r.returncode == 2, r.stdout + r.stderr
    [err] = error_lines(r.stderr)
    assert "free" in err and "alpha" in err

    r = fleet.ok("stop", "alpha")
    assert "stopped" in r.stdout
    assert fleet.clusters() == []
    [gone] = fleet.clusters(all_=True)
    assert gone["name"] == "alpha" and gone["status"] == "stopped" and gone["devices"] == []
    assert not scratch.exists(), "stopping a cluster removes its scratch folder"
    r = fleet("exec", "alpha", "--", sys.executable, "-c", "print('ran')")
    assert r.returncode == 2 and "ran" not in r.stdout
    assert "stopped" in error_lines(r.stderr)[0]

    # the freed devices can be taken again
    again = fleet.json("launch", "--gpu", "cpu", "--count", "2", "--name", "beta", "-y", "--json")
    assert again["devices"] == ["cpu0", "cpu1"]
    r = fleet("launch", "--gpu", "cpu", "--count", "1", "-y")
    assert r.returncode == 2
    assert "free" in error_lines(r.stderr)[0]
    assert [c["name"] for c in fleet.clusters()] == ["beta"]
    fleet.ok("stop", "beta")
    assert fleet.clusters() == []


def _launch_together(f: Fleet, n: int) -> list[tuple[int, str, str]]:
    procs = [
        subprocess.Popen([*CLI, "launch", "--gpu", "cpu", "--count", "1", "-y", "--json"],
                         env=f.env(), cwd=f.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=90)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def test_concurrent_launches_never_share_a_device(make_fleet: Callable[[str, int], Fleet]) -> None:
    # A fresh home: the state database is created by the racing processes themselves.
    four = make_fleet("four", 4)
    results = _launch_together(four, 4)
    assert [rc for rc, _, _ in results] == [0, 0, 0, 0], [err for _, _, err in results]
    launched = [json.loads(out) for _, out, _ in results]
    assert sorted(d for c in launched for d in c["devices"]) == ["cpu0", "cpu1", "cpu2", "cpu3"]
    listed = four.clusters()
    assert len(listed) == 4 and len({c["name"] for c in listed}) == 4
    assert sorted(d for c in listed for d in c["devices"]) == ["cpu0", "cpu1", "cpu2", "cpu3"]

    # More requests than slots: exactly the surplus is refused, cleanly, and nothing is shared.
    two = make_fleet("two", 2)
    results = _launch_together(two, 3)
    assert sorted(rc for rc, _, _ in results) == [0, 0, 2], results
    [(_, _, refused)] = [r for r in results if r[0] == 2]
    assert "Traceback" not in refused
    [err] = error_lines(refused)
    assert "free" in err
    listed = two.clusters()
    assert len(listed) == 2
    assert sorted(d for c in listed for d in c["devices"]) == ["cpu0", "cpu1"]
