"""The classes of gpufleet's commands and groups: how `--help` looks (defaults kept, flags
without a `<bool>` type, a command's options in panels, a group's help drawn without typer's
Rich help module), and parameter values checked without Pydantic where nothing needs it
(`quick_params`).

typer's `rich_utils` imports Markdown and traceback rendering (markdown-it, pygments): a third
of a second before `gpufleet --help` prints a line. A group's help is a usage line, a summary,
and two short tables, drawn here with the parts of Rich that `list` loads anyway; a command's
help (`run --help`) is typer's own.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from typer.core import TyperCommand, TyperGroup

try:
    from gpufleet.cli.quick_params import quick
except ImportError:  # a typer from before its Pydantic adapters: nothing to skip
    def quick(params: list[Any]) -> list[Any]:
        return params


class FleetCommand(TyperCommand):
    """A command whose flags show no `<bool>` and whose options may sit in named panels."""

    panels: ClassVar[dict[str, str]] = {}  # parameter name -> help panel

    def get_params(self, ctx: Any) -> list[Any]:  # ctx: typer's click Context
        params = quick(super().get_params(ctx))
        for p in params:
            if getattr(p, "is_flag", False):
                p.metavar = ""  # typer shows the metavar, or else the type, beside the option
            if p.name in self.panels:
                setattr(p, "rich_help_panel", self.panels[p.name])  # noqa: B010 (typer's own)
        return params


def _raise_one_line(exc: Exception) -> None:
    """Raise a usage error again as gpufleet's one-line error; return on anything else, and on
    a bare group's help (`NoArgsIsHelpError`), for the caller to re-raise as it was."""
    from gpufleet.cli.usage import clickx, usage_error

    if isinstance(exc, clickx.UsageError) and not isinstance(
            exc, getattr(clickx, "NoArgsIsHelpError", ())):  # click >= 8.2 has it
        raise usage_error(exc) from None


def with_panels(panels: dict[str, str]) -> type[FleetCommand]:
    """A FleetCommand class that shows the options named in `panels` under those panels."""
    return type("PanelledCommand", (FleetCommand,), {"panels": panels})


def _summary(text: str | None) -> str:
    """A help text's first paragraph on one line."""
    return " ".join(inspect.cleandoc(text or "").split("\n\n")[0].split())


class FleetGroup(TyperGroup):
    """A group (the app, `pool`, `bench`) whose help is drawn without typer's Rich module, and
    whose command-line mistakes, and those of its commands, are one `error:` line (`usage`)."""

    def get_params(self, ctx: Any) -> list[Any]:  # ctx: typer's click Context
        return quick(super().get_params(ctx))

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except Exception as exc:
            _raise_one_line(exc)
            raise

    def invoke(self, ctx: Any) -> Any:
        """Runs the command the arguments name; its own parse errors surface here."""
        try:
            return super().invoke(ctx)
        except Exception as exc:
            _raise_one_line(exc)
            raise

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            from gpufleet.cli.usage import no_such_command

            shown = [n for n in self.list_commands(ctx)
                     if (c := self.get_command(ctx, n)) is not None and not c.hidden]
            raise no_such_command(ctx, name, shown)
        return super().resolve_command(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from rich import box
        from rich.console import Console
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        console = Console(highlight=False)
        pieces = " ".join(self.collect_usage_pieces(ctx))
        console.print()
        console.print(Text.assemble(" ", ("Usage:", "yellow"), " ", (ctx.command_path, "bold"),
                                    " ", pieces))
        console.print()
        if self.help:
            console.print(Text(" " + inspect.cleandoc(self.help).replace("\n\n", "\n\n ")))
            console.print()

        def panel(title: str, rows: list[tuple[str, str]], style: str) -> Panel:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style=style, no_wrap=True)
            grid.add_column()
            for name, text in rows:
                grid.add_row(name, Text(text))
            return Panel(grid, title=title, title_align="left", border_style="dim", box=box.ROUNDED)

        options = [(", ".join(p.opts), _summary(getattr(p, "help", None)))
                   for p in self.get_params(ctx)
                   if getattr(p, "opts", None) and not getattr(p, "hidden", False)]
        console.print(panel("Options", options, "bold cyan"))
        commands = [(name, _summary(cmd.help))
                    for name in self.list_commands(ctx)
                    if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if commands:
            console.print(panel("Commands", commands, "bold cyan"))
