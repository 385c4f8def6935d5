"""`gpufleet --help`, `prices`, `list` and `status` of an ended job import none of the heavy
modules: checked by what is in `sys.modules` after the command ran, not by timing it
(bench/cli_startup.py times it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
HEAVY = ("sqlalchemy", "pydantic", "torch", "fastapi", "uvicorn", "ray", "numpy", "yaml",
         "psutil", "markdown_it", "pygments", "gpufleet.web", "gpufleet.store", "gpufleet.spec")
PROBE = """
import json, sys
sys.argv = ["gpufleet", *json.loads(sys.argv[1])]
from gpufleet.cli import main
try:
    main()
except SystemExit:
    pass
sys.stdout.flush()
sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def _modules_after(args: list[str], home: Path) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "GPUFLEET_HOME": str(home), "COLUMNS": "120"}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True,
                       text=True, env=env, timeout=60)
    line = [x for x in r.stderr.splitlines() if x.startswith("MODULES ")]
    assert line, r.stderr
    return set(json.loads(line[0][len("MODULES "):]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [["--help"], ["pool", "--help"], ["prices"], ["prices", "--json"],
                                  ["show-gpus", "--gpu", "H100"]])
def test_help_and_prices_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    assert _heavy(_modules_after(args, tmp_path)) == []


def test_list_reads_the_state_file_without_the_store(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.store import Store

    home = tmp_path / "home"
    monkeypatch.setenv("GPUFLEET_HOME", str(home))
    Store().close()  # a state file as the store makes it, with no cluster yet
    for args in (["list"], ["list", "--json"], ["list", "--all"]):
        assert _heavy(_modules_after(args, home)) == [], args


def test_stop_all_with_nothing_running_answers_without_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test's clean-up (and a user's habit) is `stop --all`; when the state file shows
    nothing running it answers from the file. With an active job it goes through the store."""
    import sqlite3

    home = tmp_path / "home"
    job = _bench_home(home, monkeypatch)
    assert _heavy(_modules_after(["stop", "--all"], home)) == []
    with sqlite3.connect(home / "state.db") as db:
        db.execute("UPDATE jobs SET status = 'running', ended_at = NULL, supervisor_pid = NULL")
    db.close()
    assert "sqlalchemy" in _modules_after(["stop", "--all"], home), job


def test_list_with_no_state_file_yet_goes_through_the_store(tmp_path: Path) -> None:
    """The first command makes the state folder; `list` may be it."""
    assert "sqlalchemy" in _modules_after(["list"], tmp_path / "fresh")
    assert (tmp_path / "fresh" / "state.db").exists()


def _bench_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The state folder bench/cli_startup.py times `status` on: one ended job; its name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "cli_startup", Path(__file__).resolve().parents[2] / "bench" / "cli_startup.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setenv("GPUFLEET_HOME", str(home))
    bench.make_home(home)
    return str(bench.JOB)


def test_status_of_an_ended_job_reads_the_state_file_without_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status JOB --json` of an ended job: no SQLAlchemy, no Pydantic (gpufleet.snapshot_job)."""
    home = tmp_path / "home"
    job = _bench_home(home, monkeypatch)
    modules = _modules_after(["status", job, "--json"], home)
    assert "gpufleet.snapshot_job" in modules
    assert _heavy(modules) == []


def test_status_of_an_active_job_goes_through_the_store(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An active job's supervisor may have died: the store records that first (reconcile),
    and `status --json` needs the views, but not the dashboard's modules."""
    import sqlite3

    home = tmp_path / "home"
    job = _bench_home(home, monkeypatch)
    with sqlite3.connect(home / "state.db") as db:
        db.execute("UPDATE jobs SET status = 'running', ended_at = NULL, supervisor_pid = NULL")
    db.close()
    modules = _modules_after(["status", job, "--json"], home)
    assert "gpufleet.views" in modules and "sqlalchemy" in modules
    assert [m for m in modules if m.startswith(("gpufleet.web", "fastapi", "uvicorn"))] == []
