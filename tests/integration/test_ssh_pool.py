"""An SSH pool of machines that share nothing with the submitter but a link (ssh_machines.py):
`pool add ssh` pins and shows the host keys, refuses what it cannot use in one line with
nothing stored, `pool list` shows each machine's CPU slots, versions and health, a machine whose
key changed or that is cut off is shown so (never an exception), `gpufleet ssh` runs on a node,
`doctor --cluster` checks the nodes reach each other, and `launch --nodes 2` holds whole nodes
until `stop`.

One set of three machines for the module; each test is a few CLI calls.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import Fleet
from ssh_machines import Machines, machines_or_skip

ADDED: dict[str, str] = {}  # what `pool add` said, once for the module


@pytest.fixture(scope="module")
def machines() -> Iterator[Machines]:
    m = machines_or_skip(3)
    yield m
    m.down()


@pytest.fixture(scope="module")
def lab(machines: Machines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A fleet with the pool `lab` of all three machines, added once."""
    base = tmp_path_factory.mktemp("ssh")
    f = Fleet(base / "home", base / "cwd", slots=2)
    ADDED["stdout"] = f.ok("pool", "add", "ssh", "--name", "lab", "--hostfile",
                           str(machines.hostfile)).stdout
    yield f
    left = f.cleanup()
    assert not left, f"processes left behind: {left}"


def _fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                         check=True).stdout
    return out.split()[1]


def _nodes(f: Fleet, pool: str = "lab") -> dict[str, dict[str, Any]]:
    [listed] = f.json("pool", "list", pool, "--json")
    assert "error" not in listed, listed
    return {r["node"]: r for r in listed["nodes"]}


def _refused(f: Fleet, *args: str) -> str:
    r = f("pool", "add", "ssh", "--name", "bad", *args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (f.home / "pools" / "bad").exists()
    return lines[0]


def test_pool_add_pins_and_shows_each_host_key(lab: Fleet, machines: Machines) -> None:
    said = ADDED["stdout"]
    for i in (1, 2, 3):
        assert f"{machines.address(i)}: {_fingerprint(machines.host_key(i).with_suffix('.pub'))}" \
            in said, said
    known = lab.home / "pools" / "lab" / "known_hosts"
    assert known.stat().st_mode & 0o777 == 0o600
    assert known.parent.stat().st_mode & 0o777 == 0o700
    assert "3 ready, 6 device(s)" in said
    assert str(machines.key) not in known.read_text()  # a path, never the key


def test_pool_list_shows_slots_versions_and_health(lab: Fleet, machines: Machines) -> None:
    rows = _nodes(lab)
    assert sorted(rows) == sorted(machines.address(i) for i in (1, 2, 3))
    for row in rows.values():
        assert (row["gpu"], row["count"], row["free"], row["health"], row["state"]) == \
            ("cpu", 2, 2, "ok", "up via eth0"), row

    # a machine whose Python has no torch (the system's): kept, shown why, never used
    a = machines.address(1)
    said = lab.ok("pool", "add", "ssh", "--name", "bare", "--host", a, "--user", "root",
                  "--identity", str(machines.key), "--python", "/usr/bin/python3",
                  "--no-default").stdout
    assert f"not ready: {a}: no torch: /usr/bin/python3 has no torch installed" in said, said
    [row] = _nodes(lab, "bare").values()
    assert (row["health"], row["free"]) == ("lost", 0), row
    assert row["state"] == "no torch: /usr/bin/python3 has no torch installed"
    lab.ok("pool", "remove", "bare")


def test_bad_input_is_one_line_and_stores_nothing(lab: Fleet, machines: Machines,
                                                  tmp_path: Path) -> None:
    bad = tmp_path / "hostfile"
    bad.write_text(f"{machines.address(1)} slots=2\n{machines.address(2)} cores=2\n")
    assert _refused(lab, "--hostfile", str(bad)) == (
        "error: hostfile: hostfile line 2: unknown key 'cores'; allowed: slots, gpu, user, "
        "port, identity, python")
    assert "identity: " in _refused(lab, "--host", machines.address(1), "--identity",
                                    str(tmp_path / "missing"))
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    assert _refused(lab, "--host", machines.address(2), "--user", "root", "--identity",
                    str(other)) == (f"error: host {machines.address(2)} refused the key {other}: "
                                    f"add {other}.pub to its authorized_keys")
    assert "no ssh host key from 169.254." in _refused(
        lab, "--host", f"169.254.{machines.subnet}.200", "--user", "root")
    assert "bad" not in {p["pool"] for p in lab.json("pool", "list", "--json")}


def test_ssh_runs_on_the_node_with_its_preset(lab: Fleet, machines: Machines) -> None:
    launched = lab.json("launch", "--pool", "lab", "--gpu", "cpu", "--count", "4", "--nodes",
                        "2", "--name", "duo", "-y", "--json")
    assert launched["nodes"] == 2
    rows = _nodes(lab)
    held = sorted(k for k, r in rows.items() if r["held_by"] == ["duo"])
    assert len(held) == 2 and all(rows[k]["free"] == 0 for k in held), rows

    r = lab.ok("ssh", "duo-worker1", "--", "sh", "-c",
               "echo $GPUFLEET_CLUSTER $GPUFLEET_NODE; ip -o -4 addr show eth0; ls /tmp | wc -l")
    name, node, *rest = r.stdout.split()
    assert (name, node) == ("duo", "worker1")
    assert sum(f"inet {a}/24" in r.stdout for a in held) == 1, r.stdout  # one of its nodes
    assert rest[-1] == "0"  # the submitter's /tmp (its home, the state folder) is not there

    # doctor: each node reaches the other's sshd and the submitter, over its eth0
    report = json.loads(lab("doctor", "--cluster", "duo", "--json").stdout)
    reach = [c for n in report["nodes"] for c in n["checks"] if c["name"] == "reach"]
    assert len(reach) == 4 and all(c["status"] == "pass" for c in reach), reach
    assert all(c["data"]["dev"] == "eth0" for c in reach), reach
    assert sum("the submitter's report address" in c["detail"] for c in reach) == 2, reach

    lab.ok("stop", "duo")
    rows = _nodes(lab)
    assert all(not r["held_by"] and r["free"] == 2 for r in rows.values()), rows


def test_a_changed_host_key_and_a_cut_machine_are_shown_never_accepted(
        lab: Fleet, machines: Machines) -> None:
    new = _fingerprint(machines.rekey(3))
    machines.cut(2)
    try:
        rows = _nodes(lab)
        # a launch never lands on them: two whole nodes are not free
        r = lab("launch", "--pool", "lab", "--gpu", "cpu", "--count", "4", "--nodes", "2", "-y")
    finally:
        machines.mend(2)
    assert r.returncode == 2, r.stdout + r.stderr
    three, two = rows[machines.address(3)], rows[machines.address(2)]
    assert three["health"] == "lost" and three["free"] == 0
    assert three["state"].startswith(f"host key changed: host {machines.address(3)}'s host key "
                                     f"changed since pool lab was added (it now shows {new})")
    assert "gpufleet pool add ssh" in three["state"] and "ssh-keygen -R" in three["state"]
    assert two["health"] == "lost" and re.match(r"unreachable: ", two["state"]), two
    assert rows[machines.address(1)]["health"] == "ok"
    lab.ok("pool", "remove", "lab")
    assert not (lab.home / "pools" / "lab").exists()
