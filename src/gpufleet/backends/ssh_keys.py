"""An SSH pool's pinned host keys: scanned once at `pool add`, shown, and kept with the pool.

Every later connection checks the host against this file (`ssh_conn.options`:
StrictHostKeyChecking=yes, UserKnownHostsFile=this file), so a machine whose key changes is
refused until someone who knows why pins it again; a key is never accepted on first use by a
job. The user's own ~/.ssh/known_hosts is neither read nor written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpufleet.backends.ssh_conn import Host
from gpufleet.errors import ConflictError

FILE = "known_hosts"
SCAN_TIMEOUT_S = 5  # ssh-keyscan -T: per host


def pool_known_hosts(home: Path, pool: str) -> Path:
    """The pool's pinned keys: $GPUFLEET_HOME/pools/NAME/known_hosts."""
    return home / "pools" / pool / FILE


def scan_argv(host: Host) -> list[str]:
    """ssh-keyscan for the key types ssh itself would use (its default set)."""
    return ["ssh-keyscan", "-p", str(host.port), "-T", str(SCAN_TIMEOUT_S), host.address]


def key_lines(text: str) -> list[str]:
    """The key lines of ssh-keyscan's output (its `# host:port SSH-2.0-...` banners dropped)."""
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def fingerprints(text: str) -> list[str]:
    """`ssh-keygen -lf` output, one key a line: "SHA256:... (ED25519)"."""
    shown = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[1].startswith("SHA256:"):
            shown.append(f"{words[1]} {words[-1]}")
    return shown


def scan(hosts: list[Host]) -> dict[Host, list[str]]:
    """Every host's key lines, all hosts at once; a host that gives none is refused, naming it
    and the fix (a host down at `pool add` cannot have its key pinned)."""
    if shutil.which("ssh-keyscan") is None:
        raise ConflictError("pool: ssh-keyscan is not on PATH; this machine needs the OpenSSH "
                            "client (Debian: apt-get install openssh-client)")

    def one(host: Host) -> list[str]:
        try:
            done = subprocess.run(scan_argv(host), capture_output=True, text=True,
                                  timeout=SCAN_TIMEOUT_S * 3, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return []
        return key_lines(done.stdout)

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        found = dict(zip(hosts, pool.map(one, hosts), strict=True))
    silent = [h for h, keys in found.items() if not keys]
    if silent:
        h = silent[0]
        more = f" (and {len(silent) - 1} more)" if len(silent) > 1 else ""
        raise ConflictError(
            f"host {h.address}: no ssh host key from {h.address}:{h.port} in "
            f"{SCAN_TIMEOUT_S} s{more}; a host must answer when the pool is added, so its key "
            "can be pinned: start its sshd (or fix --port), or leave it out")
    return found


def write(path: Path, keys: dict[Host, list[str]]) -> list[str]:
    """Write the pinned keys owner-only (folder 0700, file 0600, created with its mode) and
    return their fingerprints as `ssh-keygen -lf` shows them, one line per host."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.parent.chmod(0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    lines = [ln for found in keys.values() for ln in found]
    with open(path, "x", opener=lambda p, f: os.open(p, f, 0o600)) as fh:
        fh.write("\n".join(lines) + "\n")
    shown: list[str] = []
    for host, found in keys.items():
        done = subprocess.run(["ssh-keygen", "-lf", "-"], input="\n".join(found) + "\n",
                              capture_output=True, text=True, timeout=30)
        shown.append(f"{host.address}: " + ", ".join(fingerprints(done.stdout)))
    return shown


def forget(path: Path) -> None:
    """Remove the pool's pinned keys, and its state folder once nothing else is in it."""
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()
