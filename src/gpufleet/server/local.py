"""The local server, started on demand: the CLI that queues a job makes sure one runs, so one
person needs no setup, and it exits by itself when idle.

Its address and owner token are in $GPUFLEET_HOME/server.json (0600). A lock file keeps two
CLIs from starting two servers at the same moment.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.errors import ServerError
from gpufleet.lifecycle import owners
from gpufleet.server.serve import INFO_FILE, LOCK_FILE

START_TIMEOUT_S = 60.0


def running(home: Path) -> dict[str, Any] | None:
    """server.json of a local server that is still alive (the same process, by start time)."""
    try:
        info = json.loads((home / INFO_FILE).read_text())
        holder = owners.Holder(int(info["pid"]), info.get("started"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if owners.alive(holder) else None


def ensure(home: Path, cpu_slots: int | None = None) -> dict[str, Any]:
    """The running local server, started first if there is none."""
    with open(home / LOCK_FILE, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = running(home)
        if info is not None:
            return info
        env = dict(os.environ, GPUFLEET_HOME=str(home))
        if cpu_slots is not None:
            env["GPUFLEET_CPU_SLOTS"] = str(cpu_slots)
        with open(home / "server.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpufleet.cli", "server", "--local"], env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            info = running(home)
            if info is not None and info.get("pid") == proc.pid:
                return info
            if proc.poll() is not None:
                tail = (home / "server.log").read_text(errors="replace").strip().splitlines()
                raise ServerError(f"server: the local server exited ({proc.returncode}): "
                                  f"{tail[-1] if tail else 'no output'}; see {home / 'server.log'}")
            time.sleep(0.1)
        raise ServerError(f"server: the local server did not start within {START_TIMEOUT_S:.0f}s; "
                          f"see {home / 'server.log'}")
