"""An SSH pool of the test machines for a test module (tests/integration/machines.py: they share
nothing with the submitter but a link), through the real CLI: its `pool` fixture adds the pool
from $GPUFLEET_TEST_HOSTFILE with a project folder that exists only here, and at the module's
end checks that every machine answers and that nothing of ours is left on it (no process, no
workdir or job folder in its cache, no other new file). Shared by test_ssh_runs and
test_ssh_spares.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import WORKERS, Fleet
from machines import Machines, machines_or_skip

RUN_TIMEOUT = 300
GATE = "/root/gpufleet-test-gate"  # on each machine: the script's ranks wait after step 1 until it exists
SETTLE_S = 120.0  # a wait for events (a session's sshd ends just after its client), not a verdict
CACHE = "/root/.cache/gpufleet"  # the node side's copies (backends/ssh_node.py), root's home
# torch's compile cache, which the workers' `import torch` makes in the machine's /tmp
TORCH_TMP = "/tmp/torchinductor_root"
# Where a module could leave a file on a machine (the node environment is the harness's, pruned).
_FILES = ("find /tmp /var/tmp /dev/shm /root /srv/machine -path /srv/machine/env -prune "
          "-o -print")


class Lab(Fleet):
    """The CLI with a private $HOME, in a folder that exists only on the submitter."""

    def env(self, slots: int | None = None, **extra: str) -> dict[str, str]:
        return {**super().env(slots, **extra), "HOME": str(self.home.parent / "user")}


@dataclass
class Pool:
    hosts: Machines
    lab: Lab
    project: Path
    durable: Path  # a folder all machines and the submitter see, for --checkpoint-to

    def name(self, address: str) -> str:
        return next(n for n, a in self.hosts.addresses.items() if a == address)

    def plan(self, job: str) -> dict[str, Any]:
        return json.loads((self.lab.home / "jobs" / job / "ssh-plan.json").read_text())

    def log(self, job: str) -> str:
        return (self.lab.home / "jobs" / job / "logs" / "agent.log").read_text(errors="replace")

    def leftovers(self) -> dict[str, list[str]]:
        """Per machine, its processes of gpufleet or torch, and the job folders and workdir
        copies left in its cache."""
        out = {}
        for name in self.hosts.names:
            left = [cmd for cmd, _ in processes(self.hosts, name)
                    if "gpufleet" in cmd or "torch" in cmd]
            r = self.hosts.run(name, f"cd {CACHE} 2>/dev/null && ls -A workdirs jobs 2>/dev/null",
                               check=False)
            left += [ln for ln in r.stdout.split() if ln and not ln.endswith(":")]
            out[name] = left
        return out

    def wait_clean(self, timeout: float = 60.0) -> dict[str, list[str]]:
        deadline = time.monotonic() + timeout
        while (left := self.leftovers()) and any(left.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return {k: v for k, v in left.items() if v}

    def engine(self) -> Any:
        """The pool's engine as gpufleet builds it from the stored pool."""
        from gpufleet.backends.ssh import SshBackend
        from gpufleet.backends.ssh_conn import Host, parse_hostfile

        hosts = parse_hostfile(self.hosts.hostfile.read_text(), Host(address="defaults"))
        return SshBackend("lab", hosts, self.hosts.known_hosts)

    def second_run(self, job: str, timeout: float = RUN_TIMEOUT) -> list[str]:
        """The machines of the job's second run, once its plan is there."""
        deadline = time.monotonic() + timeout
        while self.plan(job)["nodes"][0]["env"]["GPUFLEET_RUN"] == "1":
            assert time.monotonic() < deadline, "no second run"
            time.sleep(0.2)
        return [self.name(n["address"]) for n in self.plan(job)["nodes"]]

    def gates(self, open_: bool) -> None:
        for name in self.hosts.names:
            # check=False: a machine killed a moment ago has nothing to open (it reboots empty)
            self.hosts.run(name, f"touch {GATE}" if open_ else f"rm -f {GATE}", check=False)


def _files(m: Machines, name: str) -> set[str]:
    return set(m.run(name, _FILES).stdout.split("\n")) - {""}


def _settled(m: Machines, before: dict[str, set[str]]) -> None:
    """Every machine answers over ssh, runs nothing but its sshd, and its cache holds no
    workdir or job folder; then the (empty) cache folders this module made and torch's cache
    are removed, and no other file is new on it."""
    m.settle(SETTLE_S)
    for name in m.names:
        m.run(name, f"rm -f {GATE}")
        left = m.run(name, f"find {CACHE} -mindepth 1 -not -type d 2>/dev/null; "
                           f"find {CACHE} -mindepth 2 -type d 2>/dev/null", check=False).stdout
        assert left.split() == [], f"left in {name}'s cache: {left}"
        m.run(name, f"rm -rf {CACHE} {TORCH_TMP}; rmdir /root/.cache 2>/dev/null; true")
        new = _files(m, name) - before[name]  # a rebooted machine has fewer, never more
        assert not new, f"files left on {name}: {sorted(new)}"


def ssh_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """The body of a module's `pool` fixture: the pool, then the end's checks."""
    hosts = machines_or_skip()
    before = {n: _files(hosts, n) for n in hosts.names}
    tmp = tmp_path_factory.mktemp("sshruns")
    durable = Path(tempfile.mkdtemp(prefix="gfsr-", dir="/run"))  # not hidden from the machines
    try:
        (tmp / "user").mkdir()
        project = tmp / "project"
        project.mkdir()
        shutil.copy(WORKERS / "plain_ddp.py", project / "train.py")
        lab = Lab(tmp / "home", project, slots=2)
        lab.ok("pool", "add", "ssh", "--name", "lab", "--hostfile", str(hosts.hostfile))
        yield Pool(hosts, lab, project, durable)
        left = lab.cleanup()
        assert not left, f"processes left behind on the submitter: {left}"
        _settled(hosts, before)
    finally:
        shutil.rmtree(durable, ignore_errors=True)


def said(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def processes(hosts: Machines, name: str) -> list[tuple[str, str]]:
    """(command line, environment) of every process of a machine (the machines share this
    host's process table, so they are read here, by the pids the harness finds for it)."""
    out = []
    for pid in hosts.pids(name):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        out.append((cmd, env))
    return out
