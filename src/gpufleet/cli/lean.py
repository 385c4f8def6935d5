"""Build only the command being run.

typer turns every registered command into a click command (reading each signature and its
type hints) before it looks at the command line: some twenty commands, a noticeable part of
the fraction of a second `gpufleet list` may take. `lean(app, argv)` is the same app with only
the command `argv` names; when it names none (`gpufleet`, `gpufleet --help`, a typo) every
command is kept by name and summary alone, which is all the group's help and typer's "No such
command" need.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import typer
from typer.models import CommandInfo, TyperInfo

from gpufleet.cli.help import FleetGroup


def _command_name(info: CommandInfo) -> str:
    assert info.callback is not None
    return info.name or info.callback.__name__.lower().replace("_", "-")


def _listed() -> None:
    """Stands in for a command that is only listed, never run."""


def lean(app: typer.Typer, argv: Sequence[str]) -> typer.Typer:
    """`app` with only the command (or group) `argv` names, or all of them as bare summaries."""
    name = argv[0] if argv else None  # the app's only option is --help: a command comes first
    commands = {_command_name(c): c for c in app.registered_commands}
    groups = {g.name: g for g in app.registered_groups}
    trimmed = copy.copy(app)
    if name in commands:  # with a hidden stand-in, so typer keeps a group and not one command
        trimmed.registered_commands = [commands[name], CommandInfo("_", callback=_listed,
                                                                   hidden=True)]
        trimmed.registered_groups = []
    elif name in groups:
        trimmed.registered_commands, trimmed.registered_groups = [], [groups[name]]
    else:
        trimmed.registered_commands = [
            CommandInfo(n, help=c.help or (c.callback.__doc__ if c.callback else None),
                        callback=_listed, hidden=c.hidden)
            for n, c in commands.items()]
        trimmed.registered_groups = [
            TyperInfo(typer.Typer(help=_help_of(g), cls=FleetGroup), name=g.name)
            for g in app.registered_groups]
    return trimmed


def _help_of(group: TyperInfo) -> str | None:
    inner = group.typer_instance
    text = group.help if isinstance(group.help, str) else None
    return text or (inner.info.help if inner is not None and isinstance(inner.info.help, str)
                    else None)
