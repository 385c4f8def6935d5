"""Command-line mistakes are one `error:` line like every other bad input: the parse of the real
app, in this process, raises the SpecError `gpufleet.cli.main` prints, naming the option or
argument as typed and the one meant where one is close."""

from __future__ import annotations

import pytest
import typer

from gpufleet.cli import app
from gpufleet.cli.lean import lean
from gpufleet.cli.usage import closest
from gpufleet.errors import SpecError


def refused(*argv: str) -> tuple[str, str]:
    """(field, message) of the one problem parsing `gpufleet ARGV` raises; nothing runs."""
    command = typer.main.get_command(lean(app, list(argv)))
    with pytest.raises(SpecError) as info:
        command.main(list(argv), prog_name="gpufleet", standalone_mode=False)
    [problem] = info.value.problems
    return problem


@pytest.mark.parametrize(("argv", "field", "said"), [
    (("launch", "--gpu", "cpu", "--cuont", "2"), "--cuont",
     "no such option of gpufleet launch; did you mean --count?"),
    (("list", "--frob"), "--frob", "no such option of gpufleet list; gpufleet list --help lists them"),
    (("pool", "add", "ray", "--addres", "x"), "--addres",
     "no such option of gpufleet pool add; did you mean --address?"),
    (("--bogus",), "--bogus", "no such option of gpufleet; gpufleet --help lists them"),
    (("lanch",), "command", "'lanch' is not a command of gpufleet; did you mean launch?"),
    (("pool", "lst"), "command", "'lst' is not a command of gpufleet pool; did you mean list?"),
    (("frobnicate",), "command", "'frobnicate' is not a command of gpufleet; gpufleet --help lists them"),
    (("bench", "allreduce"), "--cluster", "is required (gpufleet bench allreduce --help)"),
    (("logs",), "job", "is required (gpufleet logs --help)"),
    (("launch", "--gpu"), "--gpu", "requires an argument"),
    (("bench", "allreduce", "-c", "x", "--iters", "0"), "--iters",
     "input should be greater than or equal to 1"),
])
def test_a_mistake_names_its_option(argv: tuple[str, ...], field: str, said: str) -> None:
    assert refused(*argv) == (field, said)


def test_a_bad_number_names_the_option() -> None:
    field, said = refused("launch", "--count", "abc")
    assert field == "--count" and "integer" in said


def test_an_extra_argument_is_named() -> None:
    field, said = refused("launch", "--gpu", "cpu", "extra")
    assert field == "arguments" and "(extra)" in said and "gpufleet launch --help" in said


def test_a_scripts_option_before_the_double_dash_is_explained() -> None:
    """`run SCRIPT --epochs 3`: run has no --epochs; the script's options go after --."""
    field, said = refused("run", "--gpu", "cpu", "train.py", "--epochs", "3")
    assert field == "--epochs"
    assert said.endswith("A script's own options go after a --, e.g. -- --epochs")
    assert "did you mean" not in said  # --epochs is not a typo of any option of run
    _, typo = refused("run", "--gpu", "cpu", "train.py", "--cuont", "3")
    assert typo.startswith("no such option of gpufleet run; did you mean --count?")


def test_a_bare_group_still_prints_its_help() -> None:
    """`gpufleet` and `gpufleet pool` alone are asking for help, not mistakes."""
    command = typer.main.get_command(lean(app, ["pool"]))
    with pytest.raises(Exception) as info:
        command.main(["pool"], prog_name="gpufleet", standalone_mode=False)
    assert not isinstance(info.value, SpecError)
    assert type(info.value).__name__ == "NoArgsIsHelpError"


@pytest.mark.parametrize(("typed", "names", "found"), [
    ("--cuont", ["--count", "--cpu-slots", "--json"], "--count"),
    ("--epochs", ["--detach", "--yes", "--name"], None),  # alike only in their dashes
    ("--dryrun", ["--dry-run", "--detach"], "--dry-run"),
    ("stauts", ["status", "stop", "ssh"], "status"),
    ("x", [], None),
])
def test_closest(typed: str, names: list[str], found: str | None) -> None:
    assert closest(typed, names) == found
