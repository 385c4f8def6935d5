"""The test machines (`scripts/test-machines`) are what the SSH, Ray and Slurm tests on them
rely on: machines that share nothing with the submitter but a network.

Seen from inside a machine, over ssh as a job would be: the checkout, the submitter's $HOME,
/tmp and $GPUFLEET_HOME are not there; its node environment imports torch and a non-editable
gpufleet of its own; its only addresses are its link-local one and loopback, with no default
route; it has a host name of its own and reaches the other machines by theirs, and the
submitter's bridge address. `cut` partitions it
(ssh fails, its processes run on) and `mend` heals it; `kill` leaves nothing of it and `start`
reboots it (its /tmp empty, its disk kept); `rekey` gives it a new host key that a stale pin
refuses, its processes running on. Events are waited for, with generous deadlines.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import json
import os
import shlex
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from fleet_helpers import ROOT
from machines import Machines, machines_or_skip

VICTIM = "m3"  # the machine the cut and kill tests break (and repair)


@pytest.fixture(scope="module")
def machines() -> Machines:
    return machines_or_skip()


def _wait_answers(m: Machines, name: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while (done := m.ssh(name, "true")).returncode != 0:
        assert time.monotonic() < deadline, f"{name} does not answer: {done.stderr}"
        time.sleep(0.2)


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Files of this side a machine must not see: in $HOME, in /tmp, in a fleet's home."""
    tag = uuid.uuid4().hex
    files = {"home": Path(os.environ["HOME"]) / f".gfm-{tag}",
             "tmp": Path("/tmp") / f"gfm-{tag}",
             "var_tmp": Path("/var/tmp") / f"gfm-{tag}",
             "dev_shm": Path("/dev/shm") / f"gfm-{tag}",
             "var_log": Path("/var/log") / f"gfm-{tag}",
             "gpufleet_home": tmp_path / "home" / f"gfm-{tag}"}
    for f in files.values():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("of the submitter")
    yield {k: str(v) for k, v in files.items()}
    for f in files.values():
        f.unlink()


def test_a_machine_sees_nothing_of_the_submitter(machines: Machines,
                                                 planted: dict[str, str]) -> None:
    hidden = (machines.folder / "hidden").read_text().split()
    paths = {**planted, "checkout": str(ROOT / "pyproject.toml"),
             "checkout_venv": str(ROOT / ".venv" / "bin" / "python"),
             "harness_key": str(machines.identity)}
    for name, p in paths.items():
        assert Path(p).exists(), f"{name}: {p} should exist on this side"
    # what a machine itself writes under its own /tmp (a worker's torch cache, a raylet's
    # session: other modules' jobs ran there) is its own; the checkout is written by nobody there
    probe = ("import json, os, sys; paths, hidden = json.loads(sys.argv[1]), sys.argv[2:]; "
             "print(json.dumps({'seen': [k for k, p in paths.items() if os.path.exists(p)], "
             "'not_empty': [h for h in hidden if h == sys.argv[2] and os.path.isdir(h) "
             "and os.listdir(h)]}))")
    for name in machines.names:
        done = machines.ssh(name, f"python3 -c {shlex.quote(probe)} {shlex.quote(json.dumps(paths))} "
                            + " ".join(shlex.quote(h) for h in [str(ROOT), *hidden]))
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen == {"seen": [], "not_empty": []}, f"{name} sees {seen}"
    assert {str(ROOT), "/tmp", "/var/tmp", "/dev/shm", "/var/log"} <= set(hidden), hidden


def test_the_node_environment_is_its_own(machines: Machines) -> None:
    probe = ("import json, sys, torch, gpufleet, importlib.metadata as md; "
             "d = md.distribution('gpufleet'); u = d.read_text('direct_url.json') or '{}'; "
             "print(json.dumps({'prefix': sys.prefix, 'gpufleet': gpufleet.__file__, "
             "'editable': json.loads(u).get('dir_info', {}).get('editable', False), "
             "'torch': torch.__version__, 'version': d.version}))")
    done = machines.ssh("m1", f"{machines.python('m1')} -c {shlex.quote(probe)}", timeout=120)
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)
    assert env["prefix"] == str(Path(machines.python("m1")).parent.parent)
    assert env["gpufleet"].startswith(env["prefix"] + "/lib/"), env
    assert not env["editable"] and not env["gpufleet"].startswith(str(ROOT))
    # the same releases as this side's (without importing torch here: 3 s of CPU)
    assert (env["torch"], env["version"]) == (md.version("torch"), md.version("gpufleet"))


def test_its_only_link_is_link_local_without_a_default_route(machines: Machines) -> None:
    for name in machines.names:
        done = machines.ssh(name, "ip -o addr show; echo ROUTES; ip route show table all; "
                                  "ip -6 route show table all")
        assert done.returncode == 0, done.stderr
        addrs, routes = done.stdout.split("ROUTES\n")
        seen = sorted((ln.split()[1], ln.split()[3]) for ln in addrs.splitlines())
        link_local = [a for dev, a in seen if dev == "eth0" and a.startswith("fe80:")]
        assert seen == sorted([("lo", "127.0.0.1/8"), ("lo", "::1/128"),
                               ("eth0", f"{machines.address(name)}/24"), *(
                                   ("eth0", a) for a in link_local)]), seen
        assert "default" not in routes, routes
        for line in routes.splitlines():
            words = line.split()
            dest = words[1] if words[0] in ("local", "broadcast", "multicast", "anycast") else words[0]
            assert dest.startswith(("169.254.", "127.", "::1", "fe80:", "ff00:")), line


def test_machines_reach_each_other_and_the_submitter(machines: Machines) -> None:
    with socket.create_server((machines.submitter, 0)) as server:
        server.settimeout(60)
        port = server.getsockname()[1]
        # by name: each machine has its own host name, and knows the others'
        probe = ("import socket, sys; print(socket.gethostname()); "
                 "[print(h, socket.getaddrinfo(h, 22)[0][4][0], "
                 "socket.create_connection((h, 22), timeout=30).recv(7).decode()) "
                 "for h in sys.argv[1:]]; "
                 f"socket.create_connection(({machines.submitter!r}, {port}), timeout=30)"
                 ".sendall(b'from m1')")
        others = [n for n in machines.names if n != "m1"]
        done = machines.ssh("m1", f"python3 -c {shlex.quote(probe)} {' '.join(others)}")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["m1", *(w for n in others
                                               for w in (n, machines.address(n), "SSH-2.0"))]
        conn, (peer, _) = server.accept()
        with conn:
            assert (peer, conn.recv(7)) == (machines.address("m1"), b"from m1")


def test_cut_partitions_a_machine_and_mend_heals_it(machines: Machines) -> None:
    sleeper = _background(machines, VICTIM)
    try:
        machines.cut(VICTIM)
        done = machines.ssh(VICTIM, "true", connect_timeout_s=2)
        assert done.returncode == 255, done.stderr
        assert sleeper in machines.pids(VICTIM)  # a partition: its processes run on
    finally:
        machines.mend(VICTIM)
    _wait_answers(machines, VICTIM)
    machines.run(VICTIM, f"kill {sleeper}")
    _wait_nothing_left(machines, VICTIM)


def test_kill_ends_everything_of_a_machine_and_start_reboots_it(machines: Machines) -> None:
    sleeper = _background(machines, VICTIM)
    machines.run(VICTIM, "echo kept >/srv/machine/disk-file; echo gone >/tmp/tmp-file")
    try:
        machines.kill(VICTIM)
        assert machines.pids(VICTIM) == []
        assert _ended(sleeper)  # seen from here too, not only by the harness's own count
        done = machines.ssh(VICTIM, "true", connect_timeout_s=2)
        assert done.returncode == 255, done.stderr
    finally:
        machines.start(VICTIM)
    _wait_answers(machines, VICTIM)
    done = machines.ssh(VICTIM, "cat /srv/machine/disk-file; ls -A /tmp; rm /srv/machine/disk-file")
    assert done.stdout.split() == ["kept"], done.stdout + done.stderr
    _wait_nothing_left(machines, VICTIM)  # the session's sshd ends a moment after its client


def test_rekey_gives_a_new_host_key_and_keeps_the_machine_running(machines: Machines,
                                                                 tmp_path: Path) -> None:
    stale = tmp_path / "known_hosts"
    stale.write_text(machines.known_hosts.read_text())
    others = [ln for ln in stale.read_text().splitlines()
              if not ln.startswith(f"{machines.address(VICTIM)} ")]
    sleeper = _background(machines, VICTIM)
    machines.rekey(VICTIM)
    assert sleeper in machines.pids(VICTIM)  # a new key, not a reboot: its processes run on
    refused = dataclasses.replace(machines, known_hosts=stale).ssh(VICTIM, "true")
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr, \
        refused.stderr
    assert machines.ssh(VICTIM, "true").returncode == 0  # known_hosts names the new key
    now = machines.known_hosts.read_text().splitlines()
    assert [ln for ln in now if not ln.startswith(f"{machines.address(VICTIM)} ")] == others
    machines.run(VICTIM, f"kill {sleeper}")
    _wait_nothing_left(machines, VICTIM)


def _wait_nothing_left(m: Machines, name: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while left := m.pids(name):
        assert time.monotonic() < deadline, f"left on {name}: {left}"
        time.sleep(0.1)


def _ended(pid: int) -> bool:
    """Gone, or dead and not yet reaped by its new parent."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _background(m: Machines, name: str) -> int:
    """A process left running in the machine by an ssh session (as a node agent is)."""
    done = m.ssh(name, "nohup sleep 600 >/dev/null 2>&1 </dev/null & echo $!")
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout)
    assert pid in m.pids(name)
    return pid

