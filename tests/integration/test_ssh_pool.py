"""An SSH pool of the test machines (machines.py: they share nothing with the submitter but a
link): `pool add ssh` pins and shows the host keys, refuses what it cannot use in one line with
nothing stored, `pool list` shows each machine's CPU slots, versions and health, a machine whose
key changed, that is cut off or killed is shown so (never an exception), `gpufleet ssh` runs on a
node, `doctor --cluster` checks the nodes reach each other, and `launch --nodes 2` holds whole
nodes until `stop`.

The pool is added once for the module, from the harness's hostfile (each machine's own node
environment). The machines are shared with the other modules on them: what this module breaks
(a new host key, a killed and a cut machine) it leaves answering again, and the module's end
checks that every machine answers and that nothing of ours is left on it (no process, no file).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import Fleet
from machines import Machines, machines_or_skip

ADDED: dict[str, str] = {}  # what `pool add` said, once for the module
# Where a test could leave a file on a machine (the node environment is the harness's, pruned).
_FILES = ("find /tmp /var/tmp /dev/shm /root /srv/machine -path /srv/machine/env -prune "
          "-o -print")
SETTLE_S = 120.0  # a wait for events (a session's sshd ends just after its client), not a verdict


def _files(m: Machines, name: str) -> set[str]:
    return set(m.run(name, _FILES).stdout.split("\n")) - {""}


@pytest.fixture(scope="module")
def machines() -> Iterator[Machines]:
    m = machines_or_skip()
    before = {n: _files(m, n) for n in m.names}
    yield m
    m.settle(SETTLE_S)  # every machine up, its link mended, its key the pinned one, idle
    for name in m.names:
        new = _files(m, name) - before[name]  # a rebooted machine has fewer, never more
        assert not new, f"files left on {name}: {sorted(new)}"


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


def _fingerprints(known_hosts: Path) -> dict[str, str]:
    """The harness's pinned host keys: address -> SHA256 fingerprint."""
    out = subprocess.run(["ssh-keygen", "-lf", str(known_hosts)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[2]: line.split()[1] for line in out.splitlines()}


def _hostfile_line(m: Machines, name: str) -> str:
    [line] = [ln for ln in m.hostfile.read_text().splitlines()
              if ln.split()[:1] == [m.address(name)]]
    return line


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
    keys = _fingerprints(machines.known_hosts)
    for name in machines.names:
        a = machines.address(name)
        assert f"{a}: {keys[a]}" in said, said
    known = lab.home / "pools" / "lab" / "known_hosts"
    assert known.stat().st_mode & 0o777 == 0o600
    assert known.parent.stat().st_mode & 0o777 == 0o700
    assert "3 ready, 6 device(s)" in said
    assert str(machines.identity) not in known.read_text()  # a path, never the key


def test_pool_list_shows_slots_versions_and_health(lab: Fleet, machines: Machines,
                                                   tmp_path: Path) -> None:
    rows = _nodes(lab)
    assert sorted(rows) == sorted(machines.address(n) for n in machines.names)
    for row in rows.values():
        assert (row["gpu"], row["count"], row["free"], row["health"], row["state"]) == \
            ("cpu", 2, 2, "ok", "up via eth0"), row

    # a machine whose Python has no torch (the system's): kept, shown why, never used
    a = machines.address("m1")
    line = re.sub(r"python=\S+", "python=/usr/bin/python3", _hostfile_line(machines, "m1"))
    assert line.endswith("python=/usr/bin/python3"), line
    (tmp_path / "hostfile").write_text(line + "\n")
    said = lab.ok("pool", "add", "ssh", "--name", "bare", "--hostfile", str(tmp_path / "hostfile"),
                  "--no-default").stdout
    assert f"not ready: {a}: no torch: /usr/bin/python3 has no torch installed" in said, said
    [row] = _nodes(lab, "bare").values()
    assert (row["health"], row["free"]) == ("lost", 0), row
    assert row["state"] == "no torch: /usr/bin/python3 has no torch installed"
    lab.ok("pool", "remove", "bare")


def test_bad_input_is_one_line_and_stores_nothing(lab: Fleet, machines: Machines,
                                                  tmp_path: Path) -> None:
    one, two = machines.address("m1"), machines.address("m2")
    bad = tmp_path / "hostfile"
    bad.write_text(f"{one} slots=2\n{two} cores=2\n")
    assert _refused(lab, "--hostfile", str(bad)) == (
        "error: hostfile: hostfile line 2: unknown key 'cores'; allowed: slots, gpu, user, "
        "port, identity, python")
    assert "identity: " in _refused(lab, "--host", one, "--identity", str(tmp_path / "missing"))
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    assert _refused(lab, "--host", two, "--user", "root", "--identity", str(other)) == (
        f"error: host {two} refused the key {other}: add {other}.pub to its authorized_keys")
    # an address on the machines' link that no machine has
    nobody = machines.submitter.rsplit(".", 1)[0] + ".200"
    assert nobody not in {machines.address(n) for n in machines.names}
    assert f"no ssh host key from {nobody}" in _refused(lab, "--host", nobody, "--user", "root")
    assert "bad" not in {p["pool"] for p in lab.json("pool", "list", "--json")}


def test_ssh_runs_on_the_node_with_its_preset(lab: Fleet, machines: Machines) -> None:
    launched = lab.json("launch", "--pool", "lab", "--gpu", "cpu", "--count", "4", "--nodes",
                        "2", "--name", "duo", "-y", "--json")
    assert launched["nodes"] == 2
    rows = _nodes(lab)
    held = sorted(k for k, r in rows.items() if r["held_by"] == ["duo"])
    assert len(held) == 2 and all(rows[k]["free"] == 0 for k in held), rows

    # the submitter's state folder (under its /tmp) exists here, and not on the node
    assert lab.home.is_dir()
    r = lab.ok("ssh", "duo-worker1", "--", "sh", "-c",
               "echo $GPUFLEET_CLUSTER $GPUFLEET_NODE; ip -o -4 addr show eth0; "
               f"test -e {shlex.quote(str(lab.home))} && echo seen || echo absent")
    name, node, *rest = r.stdout.split()
    assert (name, node) == ("duo", "worker1")
    assert sum(f"inet {a}/24" in r.stdout for a in held) == 1, r.stdout  # one of its nodes
    assert rest[-1] == "absent", r.stdout

    # doctor: each node reaches the other's sshd and the submitter, over its eth0
    report = json.loads(lab("doctor", "--cluster", "duo", "--json").stdout)
    reach = [c for n in report["nodes"] for c in n["checks"] if c["name"] == "reach"]
    assert len(reach) == 4 and all(c["status"] == "pass" for c in reach), reach
    assert all(c["data"]["dev"] == "eth0" for c in reach), reach
    assert sum("the submitter's report address" in c["detail"] for c in reach) == 2, reach

    lab.ok("stop", "duo")
    rows = _nodes(lab)
    assert all(not r["held_by"] and r["free"] == 2 for r in rows.values()), rows


def test_a_changed_host_key_a_cut_and_a_killed_machine_are_shown_never_used(
        lab: Fleet, machines: Machines) -> None:
    one, two, three = (machines.address(n) for n in ("m1", "m2", "m3"))
    pinned = _fingerprints(machines.known_hosts)[three]
    machines.rekey("m3")  # reinstalled: it answers with a new key, which the pool never saw
    new = _fingerprints(machines.known_hosts)[three]
    assert new != pinned
    try:
        machines.kill("m1")  # killed: nothing answers on its address
        try:
            machines.cut("m2")  # cut off: its link is down
            rows = _nodes(lab)
            r = lab("launch", "--pool", "lab", "--gpu", "cpu", "--count", "2", "-y")
        finally:
            machines.mend("m2")
    finally:
        machines.start("m1")
    assert r.returncode == 2, r.stdout + r.stderr  # no usable node left
    x1, x2, x3 = rows[one], rows[two], rows[three]
    assert all((x["health"], x["free"]) == ("lost", 0) for x in (x1, x2, x3)), rows
    assert x3["state"].startswith(f"host key changed: host {three}'s host key changed since "
                                  f"pool lab was added (it now shows {new})"), x3
    assert "gpufleet pool add ssh" in x3["state"] and "ssh-keygen -R" in x3["state"]
    assert x1["state"] == (f"unreachable: ssh: connect to host {one} port 22: "
                           "Connection refused"), x1
    assert re.match(r"unreachable: ", x2["state"]), x2
    lab.ok("pool", "remove", "lab")
    assert not (lab.home / "pools" / "lab").exists()
