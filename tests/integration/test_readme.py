"""The README's "Using it" block, run line by line in the order shown, against a fresh state
folder, as a new user would type it: the README cannot drift from the code again.

Each line runs as written (its `# ...` comment dropped by shell rules) with stdin closed, so
`launch` takes no confirmation and `ssh` gets a shell that ends at once, from a fresh folder
holding only a link to `examples/`, with the venv's `bin` first on PATH as the README asks. Two
things differ from a terminal, each because a test must not depend on the machine: CPU slots
are fixed at 2 (the smallest machine the README promises, whatever this one has), and
`dashboard` is given `--port 0` (never a fixed port) and is ended with Ctrl-C once its page and
API have answered.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fleet_helpers import CLI, ROOT, Fleet

SERVERS = {"dashboard"}  # lines that serve until Ctrl-C
LINE_TIMEOUT_S = 420.0


def using_it_lines(readme: str) -> list[list[str]]:
    """The argument lists of the first ```bash block under '## Using it'."""
    section = readme.split("\n## Using it", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "no bash block under 'Using it'"
    lines = [shlex.split(ln, comments=True) for ln in block.group(1).splitlines()]
    return [argv for argv in lines if argv]


def test_the_block_is_what_this_test_expects() -> None:
    lines = using_it_lines((ROOT / "README.md").read_text())
    assert all(argv[0] == "gpufleet" for argv in lines), lines
    assert len(lines) >= 15, lines
    assert lines[-1] == ["gpufleet", "stop", "--all"]
    for argv in lines:  # an optional part such as `[--json]` cannot be run as written
        assert not any(a.startswith("[") for a in argv), argv


def _env(fleet: Fleet) -> dict[str, str]:
    env = fleet.env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _serve_briefly(fleet: Fleet, argv: list[str]) -> list[str]:
    """Start a server line, wait for its URL, fetch the page and /api, then Ctrl-C it; the
    names of the clusters its API listed."""
    proc = subprocess.Popen([*CLI, *argv, "--port", "0"], env=_env(fleet), cwd=fleet.cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+/)", first)
        assert found, first
        url = found.group(1)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as page:
                    assert page.status == 200 and "gpufleet" in page.read().decode().lower()
                with urllib.request.urlopen(url + "api/clusters", timeout=10) as api:
                    clusters = json.loads(api.read())
                with urllib.request.urlopen(url + "api", timeout=10) as api:  # "/api, /metrics"
                    routes = {(r["method"], r["path"]) for r in json.loads(api.read())}
                assert {("GET", "/api/clusters"), ("GET", "/metrics")} <= routes, routes
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 130, -signal.SIGINT), proc.returncode
    return [c["name"] for c in clusters]


def test_every_line_of_using_it_runs_in_order(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "home", tmp_path / "cwd", slots=2)
    (fleet.cwd / "examples").symlink_to(ROOT / "examples")
    lines = using_it_lines((ROOT / "README.md").read_text())
    took: list[str] = []
    try:
        for argv in lines:
            started = time.monotonic()
            if argv[1] in SERVERS:
                names = _serve_briefly(fleet, argv[1:])
                assert "dev" in names, names  # the page's API lists the cluster made above
            else:
                r = subprocess.run([*CLI, *argv[1:]], env=_env(fleet), cwd=fleet.cwd,
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   timeout=LINE_TIMEOUT_S)
                assert r.returncode == 0, (f"README line `{shlex.join(argv)}` exited "
                                           f"{r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
                assert "Traceback" not in r.stderr, (shlex.join(argv), r.stderr)
            took.append(f"{time.monotonic() - started:6.1f} s  {shlex.join(argv)}")
    finally:
        print("\n".join(took))
        left = fleet.cleanup()
    assert not left, f"processes left behind by the README's commands: {left}"
    assert fleet.clusters() == [], "a cluster is still running after `stop --all`"
    # run in a checkout, the block must not leave files in it: bench writes under the state folder
    assert [p.name for p in fleet.cwd.iterdir()] == ["examples"], list(fleet.cwd.iterdir())
    assert (fleet.home / "calibrations" / "calibration-dev.json").is_file()
