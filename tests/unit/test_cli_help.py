"""`--help` is honest: every default is shown (Rich must not eat `[default: ...]`), `run`'s
options sit in panels, flags show no `<bool>`, and each shared option is declared once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app

SRC = Path(__file__).resolve().parents[2] / "src"
CLI = SRC / "gpufleet" / "cli"
COMMANDS = ["prices", "plan", "launch", "list", "ssh", "exec", "stop", "run", "logs", "status",
            "dashboard", "doctor", "pool add", "pool up", "pool list", "bench allreduce",
            "bench scaling"]


def _help(*args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def run_help() -> str:
    return _help("run")


def test_run_help_shows_its_defaults(run_help: str) -> None:
    for shown in ("[default: 5m]", "[default: fp32]", "[default: 60s]", "[default: 0.9]",
                  "[default: torchrun]", "[default: one per device]"):
        assert shown in run_help, shown
    assert "a failure ." not in run_help and "failure." in run_help


def test_run_help_groups_its_options_into_panels(run_help: str) -> None:
    titles = [line.split("─ ", 1)[1].split(" ─", 1)[0] for line in run_help.splitlines()
              if line.startswith("╭─ ")]
    assert titles == ["Arguments", "Cluster", "Layout", "Precision and framework", "Survival",
                      "Code and environment that travel", "Container image",
                      "Progress of any script",
                      "Queue", "Output"]


def test_no_help_shows_a_bool_type_or_an_eaten_default() -> None:
    for command in COMMANDS:
        text = _help(*command.split())
        assert "<bool>" not in text, command
        assert " .\n" not in text and " . " not in text, command


def test_the_app_help_lists_every_command() -> None:
    text = _help()
    for command in ("prices", "launch", "list", "run", "status", "stop", "pool", "bench"):
        assert f"│ {command} " in text


def test_shared_options_are_declared_once() -> None:
    """`--gpu`, `--count`, `--json`, `-y`, `--cpu-slots`: only options.py spells them (a
    command with a different meaning, like pool up's simulated --gpu, says so itself)."""
    spelled: dict[str, list[str]] = {}
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Option":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        spelled.setdefault(arg.value, []).append(path.name)
    for flag in ("--json", "--yes", "--cpu-slots", "--count", "--disk", "--price-book",
                 "--strategy", "--framework", "--pool", "--nodes", "--precision", "--network",
                 "--gpu"):
        assert set(spelled.get(flag, [])) <= {"options.py", "pools.py"}, (flag, spelled.get(flag))
    # pool up's --gpu, --nodes, --network mean what each node of a local Ray cluster declares
    assert spelled["--gpu"].count("pools.py") == spelled["--nodes"].count("pools.py") == 1
    assert spelled["--json"] == spelled["--cpu-slots"] == spelled["--count"] == ["options.py"]


def test_lean_builds_only_the_named_command_and_lists_all_otherwise() -> None:
    from gpufleet.cli.lean import lean

    def names(argv: list[str]) -> list[str]:
        trimmed = lean(app, argv)
        return [c.name or "" for c in trimmed.registered_commands if not c.hidden] + \
            [g.name or "" for g in trimmed.registered_groups]

    assert names(["list", "--all"]) == ["list"]
    assert names(["pool", "list"]) == ["pool"]
    everything = names(["--help"])
    assert everything == names([]) == names(["--help", "list"]) == names(["no-such"])
    assert {"list", "run", "stop", "prices", "pool", "bench"} <= set(everything)
