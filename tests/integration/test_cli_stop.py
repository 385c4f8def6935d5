"""`stop` asks first on a terminal (not with -y, never without a terminal, so scripts and tests
run unattended), and `stop --all` lists the clusters and jobs it stops."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    return {**env, "PYTHONPATH": str(SRC), "GPUFLEET_HOME": str(home), "GPUFLEET_CPU_SLOTS": "4",
            "COLUMNS": "160"}


def _cli(home: Path, *args: str,
         stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", *args], stdin=stdin,
                          capture_output=True, text=True, env=_env(home), timeout=120)


def _launch(home: Path, name: str) -> None:
    r = _cli(home, "launch", "--gpu", "cpu", "--count", "1", "--name", name, "-y")
    assert r.returncode == 0, r.stderr


def test_stop_all_lists_what_it_stops_and_asks_nothing_without_a_terminal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _launch(home, "one")
    _launch(home, "two")
    r = _cli(home, "stop", "--all")  # stdin is not a terminal: no question
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Stopping 2 running cluster(s):"
    assert lines[1].startswith("  one: 1 CPU slot") and lines[2].startswith("  two: 1 CPU slot")
    assert "?" not in r.stdout
    assert any(x.startswith("Cluster one: stopped, devices freed") for x in lines)
    assert any(x.startswith("Cluster two: stopped, devices freed") for x in lines)
    assert _cli(home, "stop", "--all").stdout.strip() == "No running clusters."


def test_stop_asks_on_a_terminal_and_takes_no_for_an_answer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _launch(home, "kept")
    master, slave = pty.openpty()
    try:
        os.write(master, b"n\n")
        r = _cli(home, "stop", "kept", stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 1
    assert "Stop cluster kept (1 CPU slot)?" in r.stdout
    assert '"status": "running"' in _cli(home, "list", "--json").stdout
    r = _cli(home, "stop", "kept", "-y")
    assert r.returncode == 0 and r.stdout.startswith("Cluster kept: stopped"), r.stdout
