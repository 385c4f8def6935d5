"""The test machines of `scripts/test-machines`, for every test that runs on machines sharing
nothing with the submitter (no checkout, no $HOME, no /tmp, no $GPUFLEET_HOME of ours).

The machines are the ones `.ci/run` or `scripts/check` started (`up 3 DIR`), named by the
variables `up` prints: $GPUFLEET_TEST_MACHINES (DIR), $GPUFLEET_TEST_HOSTFILE (for `gpufleet pool
add ssh --hostfile`), $GPUFLEET_TEST_KNOWN_HOSTS (their host keys) and
$GPUFLEET_TEST_SUBMITTER_ADDR (this side's address on their bridge). Without them a test is
skipped, and under CI=true it fails: CI must run these tests.

Every test module that imports this helper is in one xdist group, `machines` (tests/conftest.py
finds them by that import), so two such tests never run at once: they share three machines. A
test that kills or cuts a machine starts or mends it again in a `finally`; one that rekeys a
machine leaves it answering with its new key, which `known_hosts` then names.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-machines"
ACTION_TIMEOUT_S = 120  # `start` waits up to 60 s for sshd itself; a wait, never a verdict


@dataclass(frozen=True)
class Machines:
    """Machines m1..mN of one `scripts/test-machines up`, and what a test does to them."""

    folder: Path
    hostfile: Path
    known_hosts: Path
    submitter: str  # this side's address on the machines' bridge (where nodes reach us)
    addresses: dict[str, str]  # m1 -> 169.254.X.11, in the hostfile's order
    pythons: dict[str, str]  # m1 -> its node environment's interpreter, as the machine sees it

    @property
    def names(self) -> list[str]:
        return list(self.addresses)

    @property
    def identity(self) -> Path:
        """The harness's private key (every machine's root accepts it)."""
        return self.folder / "id_ed25519"

    def address(self, name: str) -> str:
        return self.addresses[name]

    def python(self, name: str) -> str:
        """The node environment's interpreter, as the machine sees it (the hostfile's python=)."""
        return self.pythons[name]

    def _script(self, *args: str, timeout: float = ACTION_TIMEOUT_S) -> str:
        done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"test-machines {' '.join(args)}: {done.stderr}"
        return done.stdout

    def run(self, name: str, cmd: str | list[str], timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """`cmd` inside the machine (its network and mounts), as root with a login's plain
        environment; a string goes to `bash -c`. Not through sshd: works while it is cut."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else cmd
        done = subprocess.run([str(SCRIPT), "exec", str(self.folder), name, *argv],
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{name}: {argv} -> {done.returncode}: {done.stderr}"
        return done

    def ssh_argv(self, name: str, cmd: str, connect_timeout_s: int = 5) -> list[str]:
        """ssh to the machine as root, as a user would: no prompt, its pinned host key."""
        return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"ConnectTimeout={connect_timeout_s}",
                "-o", "LogLevel=ERROR", "-i", str(self.identity), "-o", "IdentitiesOnly=yes", "-T",
                f"root@{self.address(name)}", cmd]

    def ssh(self, name: str, cmd: str, timeout: float = 60,
            connect_timeout_s: int = 5) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.ssh_argv(name, cmd, connect_timeout_s), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def kill(self, name: str) -> None:
        """Every process of the machine SIGKILLed at once (a power cut); `start` reboots it."""
        self._script("kill", str(self.folder), name)

    def start(self, name: str) -> None:
        """Its sshd started again (a reboot: its /tmp and home are empty), once it answers."""
        self._script("start", str(self.folder), name)

    def cut(self, name: str) -> None:
        """Its link down (a partition); its processes run on. `mend` brings it back."""
        self._script("cut", str(self.folder), name)

    def mend(self, name: str) -> None:
        self._script("mend", str(self.folder), name)

    def rekey(self, name: str) -> None:
        """A new host key (a reinstalled machine): its sshd reloads it, `known_hosts` names it;
        back once it answers with it. Its processes and files are kept."""
        self._script("rekey", str(self.folder), name)

    def pids(self, name: str) -> list[int]:
        """The machine's processes other than its sshd listener (empty: nothing left there).
        An ssh connection still open to it (a ControlPersist master) shows as its sshd session."""
        return [int(p) for p in self._script("pids", str(self.folder), name).split()]


    def settle(self, timeout_s: float = 120.0) -> None:
        """Wait until every machine answers ssh and runs nothing of anyone's (a module's end:
        the next module shares them). A wait for events (a session's sshd ends just after its
        client), not a verdict on speed."""
        deadline = time.monotonic() + timeout_s
        for name in self.names:
            while (done := self.ssh(name, "true")).returncode != 0:
                assert time.monotonic() < deadline, f"{name} does not answer: {done.stderr}"
                time.sleep(0.2)
        for name in self.names:
            while left := self.pids(name):
                assert time.monotonic() < deadline, f"processes left on {name}: {left}"
                time.sleep(0.2)

def from_env() -> Machines | None:
    folder = os.environ.get("GPUFLEET_TEST_MACHINES")
    if not folder:
        return None
    hostfile = Path(os.environ.get("GPUFLEET_TEST_HOSTFILE", f"{folder}/hostfile"))
    lines = [ln.split() for ln in hostfile.read_text().splitlines() if ln.strip()]
    names = [f"m{k}" for k in range(1, len(lines) + 1)]
    return Machines(folder=Path(folder), hostfile=hostfile,
                    known_hosts=Path(os.environ.get("GPUFLEET_TEST_KNOWN_HOSTS",
                                                    f"{folder}/known_hosts")),
                    submitter=os.environ["GPUFLEET_TEST_SUBMITTER_ADDR"],
                    addresses={n: words[0] for n, words in zip(names, lines, strict=True)},
                    pythons={n: next(w[7:] for w in words if w.startswith("python="))
                             for n, words in zip(names, lines, strict=True)})


def machines_or_skip() -> Machines:
    """The test machines; without them the test is skipped (failed under CI=true)."""
    found = from_env()
    if found is None:
        why = ("no test machines: $GPUFLEET_TEST_MACHINES is not set (as root: eval "
               "\"$(scripts/test-machines up 3 /tmp/gfm)\")")
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the test machines: {why}")
        pytest.skip(why)
    return found
