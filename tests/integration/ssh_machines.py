"""Machines that share nothing with the submitter but a link, for the SSH pool's tests, until
`scripts/test-machines` (tests/integration/machines.py) lands; then the tests switch to it.

Each machine is a network namespace joined to one bridge in the root namespace by a veth pair,
on link-local addresses (169.254.S.0/24, S picked per run among subnets nobody here uses; the
submitter is 169.254.S.254), with no default route. Its sshd runs in a mount namespace of its
own in which /tmp is an empty tmpfs: the submitter's $HOME and $GPUFLEET_HOME (the tests keep
them under /tmp) are not there. The machines' keys and configs live under /var/tmp.

What is not yet as the real harness will be: the node's Python is the checkout's `.venv` (the
checkout is visible to the machines), not a node environment of its own.

`cut` takes a machine's link down (a machine gone, as its peers see it), `rekey` restarts its
sshd with a new host key (a reinstalled machine). Everything is ended by pid and removed by the
names this run made.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _free_subnet() -> int:
    used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True,
                          timeout=30).stdout
    for s in [(os.getpid() + k) % 200 + 30 for k in range(200)]:
        if f"169.254.{s}." not in used:
            return s
    raise RuntimeError("no free 169.254.S.0/24 subnet")


@dataclass
class Machines:
    n: int
    tag: str = field(default_factory=lambda: str(os.getpid() % 10**6))
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(
        prefix="sshpool-machines-", dir="/var/tmp")))
    subnet: int = 0
    sshd: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"spb{self.tag}"

    def ns(self, i: int) -> str:
        return f"spm{self.tag}-{i}"

    def veth(self, i: int) -> str:
        return f"sp{self.tag}r{i}"

    def address(self, i: int) -> str:
        return f"169.254.{self.subnet}.{i}"

    @property
    def submitter(self) -> str:
        return f"169.254.{self.subnet}.254"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def hostfile(self) -> Path:
        return self.dir / "hostfile"

    def host_key(self, i: int) -> Path:
        return self.dir / f"host{i}"

    def up(self) -> Machines:
        self.subnet = _free_subnet()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)],
                       check=True, timeout=30)
        shutil.copy(self.key.with_suffix(".pub"), self.dir / "authorized_keys")
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.submitter}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        lines = []
        for i in range(1, self.n + 1):
            _ip("netns", "add", self.ns(i))
            _ip("link", "add", self.veth(i), "type", "veth", "peer", "name", "eth0",
                "netns", self.ns(i))
            _ip("link", "set", self.veth(i), "master", self.bridge)
            _ip("link", "set", self.veth(i), "up")
            _ip("-n", self.ns(i), "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", self.ns(i), "link", "set", "eth0", "up")
            _ip("-n", self.ns(i), "link", "set", "lo", "up")
            self.start(i, new_key=True)
            lines.append(f"{self.address(i)} slots=2 user=root port=22 identity={self.key} "
                         f"python={sys.executable}")
        self.hostfile.write_text("\n".join(lines) + "\n")
        return self

    def start(self, i: int, new_key: bool = False) -> None:
        """sshd of machine `i` (a new host key first when asked), waited for until it listens."""
        if new_key:
            for p in (self.host_key(i), self.host_key(i).with_suffix(".pub")):
                p.unlink(missing_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(self.host_key(i))], check=True, timeout=30)
        conf = self.dir / f"sshd{i}.conf"
        conf.write_text(
            f"Port 22\nListenAddress {self.address(i)}\nHostKey {self.host_key(i)}\n"
            f"AuthorizedKeysFile {self.dir}/authorized_keys\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            f"StrictModes no\nUsePAM no\nPidFile {self.dir}/sshd{i}.pid\n")
        Path("/run/sshd").mkdir(exist_ok=True)
        self.sshd[i] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(i), "unshare", "--mount", "--propagation",
             "private", "bash", "-c",
             f"mount -t tmpfs none /tmp && exec {SSHD} -D -f {conf} -E {self.dir}/sshd{i}.log"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:  # an event: the port answers
            try:
                socket.create_connection((self.address(i), 22), timeout=2).close()
                return
            except OSError:
                if self.sshd[i].poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / f"sshd{i}.log").read_text(errors="replace")
                    raise RuntimeError(f"sshd of machine {i} did not start: {log}") from None
                time.sleep(0.1)

    def stop_sshd(self, i: int) -> None:
        proc = self.sshd.pop(i, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)

    def rekey(self, i: int) -> Path:
        """Machine `i` reinstalled: its sshd back with a new host key (returned)."""
        self.stop_sshd(i)
        self.start(i, new_key=True)
        return self.host_key(i).with_suffix(".pub")

    def cut(self, i: int) -> None:
        _ip("link", "set", self.veth(i), "down")

    def mend(self, i: int) -> None:
        _ip("link", "set", self.veth(i), "up")

    def down(self) -> None:
        for i in list(self.sshd):
            try:
                self.stop_sshd(i)
            except subprocess.TimeoutExpired:
                self.sshd[i].kill()
        for i in range(1, self.n + 1):
            subprocess.run(["ip", "link", "del", self.veth(i)], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", self.ns(i)], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def machines_or_skip(n: int) -> Machines:
    """`n` machines, or a skip saying what this host lacks (root, ip, sshd)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or not SSHD.exists():
        pytest.skip("SSH machines need root, iproute2 and openssh-server (apt-get install "
                    "openssh-server)")
    m = Machines(n)
    try:
        return m.up()
    except BaseException:
        m.down()
        raise
