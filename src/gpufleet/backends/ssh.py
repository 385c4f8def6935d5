"""A team's own machines as a pool, reached over ssh: nothing runs on them but sshd until a job.

The pool is a list of hosts (`ssh_conn.Host`, from `--host` or a hostfile) and the host keys
pinned when it was added (`ssh_keys`). Discovery runs one probe per host, all hosts at once,
each with its own timeout: `ssh HOST -- PYTHON - PEER...` with `ssh_probe`'s source on stdin,
so a node needs only Python and sshd to say what it has (`ssh_nodes` turns that into a node).
A host that does not answer, refuses our key, shows another host key, lacks torch or runs
another gpufleet version is a node that is not healthy, with its state saying why; discovery
never raises for one host.

gpufleet's own allocator gangs whole nodes, as on a Ray pool (the engine does not allocate).
A run is `gpufleet.backends.ssh_run` (a local driver, one torchrun per node over ssh).
Node ids are the hosts' addresses.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet.backends import ssh_nodes
from gpufleet.backends.base import Prepared, Reach, RunRequest
from gpufleet.backends.driver_procs import DriverProcs
from gpufleet.backends.exits import lost_line, take_lost
from gpufleet.backends.kinds import CAPABILITIES, Capabilities, Kind
from gpufleet.backends.ssh_conn import Host, ssh_argv
from gpufleet.errors import NotFoundError
from gpufleet.pool.model import Node

PLAN_FILE = "ssh-plan.json"  # in the job folder; the driver writes the lost nodes beside it
PROBE_TIMEOUT_S = 10.0  # per host, the whole probe (connect, Python start, nvidia-smi)


def private_dir(path: Path) -> Path:
    """`path` as a folder only this user can enter (ssh's ControlPath sockets live there);
    one that another user owns, or a link, is refused rather than used."""
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a folder of this user's; remove it")
    if st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def control_dir() -> Path:
    """Short (a socket path has about 100 bytes), private, per user."""
    return Path("/tmp") / f"gpufleet-ssh-{os.getuid()}"


def is_loopback(address: str) -> bool:
    return address == "localhost" or address.startswith("127.") or address == "::1"


class SshBackend(DriverProcs):
    """Hosts over ssh: discovery by probe, runs by a local driver that reaches each node over
    one multiplexed connection."""

    kind: Kind = "ssh"
    name = "ssh"
    capabilities: Capabilities = CAPABILITIES["ssh"]
    pids_here = False  # workers run on other machines; a pid in a report is not ours

    def __init__(self, pool: str, hosts: list[Host], known_hosts: Path,
                 probe_timeout_s: float = PROBE_TIMEOUT_S):
        self.pool, self.hosts, self.known_hosts = pool, hosts, known_hosts
        self.probe_timeout_s = probe_timeout_s
        self.control_dir = control_dir()  # made (0700) by private_dir when first used
        self.failed: dict[str, str] = {}  # the last discovery's hosts ssh could not ask, why
        self.init_procs()

    def host_of(self, node_id: str) -> Host:
        for host in self.hosts:
            if host.address == node_id:
                return host
        raise NotFoundError(f"node: {node_id} is not a host of pool {self.pool}; its hosts: "
                            + ", ".join(h.address for h in self.hosts))

    def argv(self, host: Host, remote: list[str], tty: bool = False,
             multiplexed: bool = False) -> list[str]:
        """ssh to `host` with the pool's options; `multiplexed`: over the host's one shared
        connection (a run's many commands), else a connection of its own (a probe, a shell)."""
        control = private_dir(self.control_dir) if multiplexed else None
        return ssh_argv(host, self.known_hosts, remote, control, tty=tty,
                        connect_timeout_s=max(1, int(self.probe_timeout_s / 2)))

    # -- discovery ------------------------------------------------------------------------------
    def probe_one(self, host: Host) -> Node:
        """One host's node, from its probe, within `probe_timeout_s`; never raises."""
        peers = [h.address for h in self.hosts if h.address != host.address]
        source = (Path(__file__).parent / "ssh_probe.py").read_text()
        try:
            done = subprocess.run(self.argv(host, [host.python, "-", *peers]), input=source,
                                  capture_output=True, text=True, timeout=self.probe_timeout_s)
        except subprocess.TimeoutExpired:
            code, out, err = None, "", ""
        except OSError as exc:  # no ssh client here
            self.failed[host.address] = f"unreachable: cannot run ssh: {exc}"
            return ssh_nodes.unreachable(host, self.failed[host.address])
        else:
            code, out, err = done.returncode, done.stdout, done.stderr
        if code != 0:
            why = ssh_nodes.failure(host, code, err, self.known_hosts, self.pool,
                                    self.probe_timeout_s)
            self.failed[host.address] = why
            return ssh_nodes.unreachable(host, why)
        return ssh_nodes.node_of(host, out, __version__)

    def discover(self) -> list[Node]:
        """Every host's node, probed all at once: the whole takes about one probe's time. A
        healthy node's state names the interface its routes to the other hosts leave by."""
        self.failed = {}
        with ThreadPoolExecutor(max_workers=min(32, len(self.hosts) or 1)) as workers:
            return list(workers.map(self.probe_one, self.hosts))

    # -- a shell on a node (base.NodeShell) -----------------------------------------------------
    def shell(self, ref: str, node_id: str, argv: list[str],
              env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """`argv` on the node over ssh with the pool's options, a terminal when it is a shell;
        `env` (the node's preset) is set there by `env K=V`: it holds device pins and names,
        never a secret."""
        host = self.host_of(node_id)
        remote = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]
        return self.argv(host, remote, tty=sys.stdin.isatty()), dict(os.environ)

    # -- what a node reaches (base.Reaches) -----------------------------------------------------
    def reach(self, node_id: str, peers: list[str],
              extra: list[tuple[str, int]]) -> list[Reach]:
        """From node `node_id`: a TCP connection to each peer's sshd and to each of `extra`."""
        host = self.host_of(node_id)
        targets = [f"{self.host_of(p).address}:{self.host_of(p).port}" for p in peers]
        targets += [f"{address}:{port}" for address, port in extra]
        source = (Path(__file__).parent / "ssh_probe.py").read_text()
        timeout_s = self.probe_timeout_s + 4 * len(targets)
        try:
            done = subprocess.run(self.argv(host, [host.python, "-", "--reach", *targets]),
                                  input=source, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code, out, err = None, "", ""
        else:
            code, out, err = done.returncode, done.stdout, done.stderr
        if code != 0:
            raise ConnectionError(ssh_nodes.failure(host, code, err, self.known_hosts,
                                                    self.pool, timeout_s))
        return ssh_nodes.reaches(out)

    # -- runs -----------------------------------------------------------------------------------
    def prepare(self, run: RunRequest) -> Prepared:
        from gpufleet.backends import ssh_plan

        return ssh_plan.prepare(self, run)

    def sees(self, node_ids: Sequence[str], path: Path, content: str,
             ref: str = "") -> dict[str, bool]:
        """shipping.SharesFiles: whether each host reads exactly `content` at `path`."""
        from gpufleet.backends import ssh_plan

        return ssh_plan.sees(self, node_ids, path, content)

    def check_image(self, node_ids: Sequence[str], container: Mapping[str, Any],
                    ref: str = "") -> dict[str, str]:
        """image_nodes.ChecksImages: each host's own preflight of the job's image."""
        from gpufleet.backends import ssh_plan

        return ssh_plan.check_image(self, node_ids, dict(container))

    def node_lost(self, code: int, lines: list[str]) -> str | None:
        """The driver exits NODE_LOST_EXIT after a line `NodeLostError: ...`."""
        return lost_line(code, lines)

    def lost_nodes(self, job_dir: Path) -> set[str]:
        """The nodes the driver named lost."""
        return take_lost(job_dir / PLAN_FILE)

    def report_host(self) -> str:
        """The address our route to the first host leaves from (loopback for loopback hosts)."""
        if not self.hosts or all(is_loopback(h.address) for h in self.hosts):
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(self.hosts[0].address), 9))  # picks a route only
            return str(probe.getsockname()[0])
