"""Hosts that share nothing with this process, for the SSH-run tests: each a network namespace
with its own link-local address on a bridge of its own, and a mount namespace in which the
checkout, /tmp and /root are empty tmpfs, running an sshd that takes a key made here.

A stand-in for `scripts/test-machines` (tests/integration/machines.py) until it lands: the
same verbs (`kill`, `cut`, `mend`, `pids`) and a hostfile in its format. Each host's Python is
a venv of its own outside the hidden folders, whose packages are the submitter's torch (bind-
mounted read-only) and a copy of gpufleet's source, not the submitter's editable install.
Only link-local 169.254.0.0/16 addresses on links made here; no route anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import gpufleet

CHECKOUT = Path(gpufleet.__file__).resolve().parents[2]


def _sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@dataclass
class Hosts:
    root: Path
    tag: str
    subnet: int
    count: int
    sshds: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    # -- names ----------------------------------------------------------------------------------
    def ns(self, k: int) -> str:
        return f"gfs{self.tag}m{k}"

    def veth(self, k: int) -> str:
        return f"gfv{self.tag}{k}"

    @property
    def bridge(self) -> str:
        return f"gfb{self.tag}"

    def address(self, k: int) -> str:
        return f"169.254.{self.subnet}.{10 + k}"

    @property
    def here(self) -> str:
        return f"169.254.{self.subnet}.1"

    @property
    def python(self) -> str:
        return str(self.root / "node" / "env" / "bin" / "python3")

    @property
    def identity(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def hostfile(self) -> str:
        return "".join(f"{self.address(k)} slots=2 user=root port=22 identity={self.identity} "
                       f"python={self.python}\n" for k in range(1, self.count + 1))

    # -- verbs ----------------------------------------------------------------------------------
    def pids(self, k: int) -> list[int]:
        """Every process in host k (its network namespace)."""
        out = subprocess.run(["ip", "netns", "pids", self.ns(k)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def run(self, k: int, command: str) -> subprocess.CompletedProcess[str]:
        """A command inside host k, as its sshd's sessions see it (over ssh)."""
        return subprocess.run(
            ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
             "-o", "StrictHostKeyChecking=yes", "-i", str(self.identity), "-o",
             "ConnectTimeout=5", f"root@{self.address(k)}", command],
            capture_output=True, text=True, timeout=60)

    def kill(self, k: int) -> None:
        """Everything of host k at once (its sshd, sessions and workers), as a power cut."""
        for pid in self.pids(k):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc = self.sshds.pop(k, None)
        if proc is not None:
            proc.wait(timeout=30)

    def cut(self, k: int) -> None:
        _sh("ip", "link", "set", self.veth(k), "down")

    def mend(self, k: int) -> None:
        _sh("ip", "link", "set", self.veth(k), "up")

    # -- up and down ----------------------------------------------------------------------------
    def up(self) -> None:
        root = self.root
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.identity))
        shutil.copy(f"{self.identity}.pub", root / "authorized_keys")
        self._node_env()
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{self.here}/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for k in range(1, self.count + 1):
            self.start(k)

    def start(self, k: int) -> None:
        root, ns, veth = self.root, self.ns(k), self.veth(k)
        if ns not in _sh("ip", "netns", "list"):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _sh("ip", "link", "set", f"{veth}p", "netns", ns)
            _sh("ip", "link", "set", veth, "master", self.bridge)
            _sh("ip", "link", "set", veth, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", f"{veth}p", "name", "eth0")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(k)}/24", "dev",
                "eth0")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / f"host{k}"))
            pub = (root / f"host{k}.pub").read_text().split()
            with self.known_hosts.open("a") as f:
                f.write(f"{self.address(k)} {pub[0]} {pub[1]}\n")
        conf = root / f"sshd{k}.conf"
        conf.write_text(
            f"Port 22\nListenAddress {self.address(k)}\nHostKey {root}/host{k}\n"
            f"AuthorizedKeysFile {root}/authorized_keys\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            f"StrictModes no\nUsePAM no\nPidFile {root}/sshd{k}.pid\nMaxSessions 50\n"
            "MaxStartups 50\n")
        site = sysconfig.get_paths()["purelib"]
        hide = " && ".join(f"mount -t tmpfs none {p}" for p in (CHECKOUT, "/tmp", "/root"))
        # the interpreter itself (pyenv's, under /root) stays where it is, as an admin's would
        base = sys.base_prefix
        script = (f"mount --bind -o ro {site} {root}/node/site && "
                  f"mount --bind -o ro {base} {root}/node/base && {hide} && "
                  f"mkdir -p {base} && mount --bind {root}/node/base {base} && "
                  f"exec /usr/sbin/sshd -D -f {conf} -E {root}/sshd{k}.log")
        self.sshds[k] = subprocess.Popen(
            ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private",
             "bash", "-c", script], stdin=subprocess.DEVNULL)
        for _ in range(300):  # sshd listening: a connection is answered
            if self.run(k, "true").returncode == 0:
                return
            if self.sshds[k].poll() is not None:
                break
        raise RuntimeError(f"sshd of host {k} did not come up: "
                           + (root / f"sshd{k}.log").read_text(errors="replace")[-2000:])

    def _node_env(self) -> None:
        """A venv of the hosts' own: torch from the submitter's packages (bind-mounted inside
        each host, the only copy of 2 GB there is), gpufleet as copied source."""
        node = self.root / "node"
        (node / "site").mkdir(parents=True)
        (node / "base").mkdir()
        shutil.copytree(CHECKOUT / "src" / "gpufleet", node / "src" / "gpufleet",
                        ignore=shutil.ignore_patterns("__pycache__"))
        _sh(os.path.realpath(sys.executable), "-m", "venv", "--without-pip", str(node / "env"))
        purelib = _sh(str(node / "env" / "bin" / "python3"), "-c",
                      "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
        Path(purelib, "gpufleet_node.pth").write_text(f"{node}/src\n{node}/site\n")

    def down(self) -> None:
        for k in range(1, self.count + 1):
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                self.kill(k)
            subprocess.run(["ip", "link", "del", self.veth(k)], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.ns(k)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def hosts_up(count: int) -> Hosts:
    """`count` hosts, up; `down()` leaves nothing. The working folder is under /var/tmp: /tmp
    is hidden inside the hosts."""
    root = Path(tempfile.mkdtemp(prefix="gf-ssh-", dir="/var/tmp"))
    h = Hosts(root, secrets.token_hex(2), 100 + secrets.randbelow(150), count)
    try:
        h.up()
    except BaseException:
        h.down()
        raise
    return h


def can_run() -> str:
    """Why these hosts cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not Path("/usr/sbin/sshd").exists():
        return "needs sshd (apt-get install openssh-server)"
    return ""
