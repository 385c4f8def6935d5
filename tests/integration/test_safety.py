"""No shell injection, owner-only state, and a CLI that never imports torch for its quick commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_helpers import CLI, WORKERS, Fleet, error_lines

EVIL_ARGS = ["; touch INJECTED #", "$(touch INJECTED2)", "`touch INJECTED3`", "&& touch INJECTED4",
             "| touch INJECTED5", "a b\tc", "--not-an-option", "'\"quoted\""]
EVIL_ENV = "$(touch INJECTED6); touch INJECTED7"


def _injected(*roots: Path) -> list[Path]:
    found = [p for root in roots if root.exists() for p in root.rglob("INJECTED*")]
    return found + [p for p in Path.cwd().glob("INJECTED*")]


def test_arguments_reach_the_worker_literally_and_never_a_shell(fleet: Fleet, tmp_path: Path) -> None:
    # The script's own path holds shell syntax too.
    script = tmp_path / "scripts" / "echo $(touch INJECTED8); x.py"
    script.parent.mkdir()
    shutil.copy(WORKERS / "argv_echo.py", script)

    r = fleet("run", "--gpu", "cpu", "--count", "1", "--name", "inj", "--keep", "-y",
              "-e", f"EVIL={EVIL_ENV}", str(script), "--", *EVIL_ARGS, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln for ln in fleet.ok("logs", "inj", "--rank", "0").stdout.splitlines()
             if ln.startswith("ARGV=")]
    assert lines, "the worker did not run"
    got = json.loads(lines[0].removeprefix("ARGV="))
    assert got == {"argv": EVIL_ARGS, "evil": EVIL_ENV}

    # --keep: the cluster made for the job outlives it; exec into it passes an argument list too
    [kept] = fleet.clusters()
    assert kept["job"] == "inj" and kept["job_status"] == "succeeded" and kept["status"] == "running"
    code = "import sys, json; print(json.dumps(sys.argv[1:]))"
    r = fleet.ok("exec", kept["name"], "--", sys.executable, "-c", code, *EVIL_ARGS)
    assert json.loads(r.stdout) == EVIL_ARGS

    # a cluster name is not a place for shell syntax: refused before anything runs
    r = fleet("launch", "--gpu", "cpu", "--name", "x;touch INJECTED9", "-y")
    assert r.returncode == 2 and "name:" in error_lines(r.stderr)[0]

    assert _injected(tmp_path) == []


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_state_is_private_to_its_owner(fleet: Fleet, tmp_path: Path) -> None:
    # A state folder the CLI creates itself.
    assert not fleet.home.exists()
    fleet.ok("launch", "--gpu", "cpu", "--count", "1", "--name", "priv", "-y")
    assert _mode(fleet.home) == 0o700
    assert _mode(fleet.home / "state.db") == 0o600
    assert _mode(fleet.home / "clusters" / "priv") == 0o700
    fleet.ok("stop", "priv")

    # One the user made already is used as it is (gpufleet changes the mode only of folders it
    # creates; one other users may write to is refused: test_state_guards.py). A state file in
    # it with loose permissions loses its group and other bits, even under a permissive umask.
    mine = Fleet(tmp_path / "mine", tmp_path / "cwd", slots=2)
    mine.home.mkdir()
    mine.home.chmod(0o750)
    db = mine.home / "state.db"
    db.touch()
    db.chmod(0o666)
    r = subprocess.run([*CLI, "list", "--json"], env=mine.env(), cwd=mine.cwd, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.umask(0))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []
    assert _mode(mine.home) == 0o750
    assert _mode(db) == 0o600
    for extra in ("state.db-wal", "state.db-shm"):
        if (mine.home / extra).exists():
            assert _mode(mine.home / extra) & 0o077 == 0, extra


_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|(\s*)(\S+)$")


def _imported(argv: list[str], fleet: Fleet) -> set[str]:
    r = subprocess.run([sys.executable, "-X", "importtime", *argv], env=fleet.env(), cwd=fleet.cwd,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return {m.group(2) for ln in r.stderr.splitlines() if (m := _IMPORT_LINE.match(ln))}


@pytest.mark.parametrize("argv", [
    ["-c", "import gpufleet, gpufleet.train"],
    ["-m", "gpufleet.cli", "--help"],
    ["-m", "gpufleet.cli", "list"],
    ["-m", "gpufleet.cli", "list", "--json"],
    ["-m", "gpufleet.cli", "prices"],
], ids=["import", "help", "list", "list-json", "prices"])
def test_quick_commands_do_not_import_torch(fleet: Fleet, argv: list[str]) -> None:
    mods = _imported(argv, fleet)
    assert "gpufleet" in mods, "importtime output was not parsed"
    torch_mods = sorted(m for m in mods if m == "torch" or m.startswith("torch."))
    assert torch_mods == [], torch_mods[:5]
