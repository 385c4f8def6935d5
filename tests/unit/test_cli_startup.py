"""`gpufleet --help`, `prices` and `list` import none of the heavy modules: checked by what
is in `sys.modules` after the command ran, not by timing it (bench/cli_startup.py times it)."""

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


def test_list_with_no_state_file_yet_goes_through_the_store(tmp_path: Path) -> None:
    """The first command makes the state folder; `list` may be it."""
    assert "sqlalchemy" in _modules_after(["list"], tmp_path / "fresh")
    assert (tmp_path / "fresh" / "state.db").exists()


def test_status_reads_the_views_without_the_web_package(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`status --json` needs the store, but not the dashboard's modules."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "cli_startup", Path(__file__).resolve().parents[2] / "bench" / "cli_startup.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    home = tmp_path / "home"
    monkeypatch.setenv("GPUFLEET_HOME", str(home))
    bench.make_home(home)
    modules = _modules_after(["status", bench.JOB, "--json"], home)
    assert "gpufleet.views" in modules
    assert [m for m in modules if m.startswith(("gpufleet.web", "fastapi", "uvicorn"))] == []
