"""Command-line mistakes as gpufleet's one `error:` line: an unknown option or command, a missing
option or argument, a value click or typer refuses (a bad choice, a number out of range).

click reports these as a usage line, a hint and a message, which typer draws in a box: five
lines, with the one that matters in the middle, unlike every other bad input. Here each becomes
a `SpecError` (printed as `error: FIELD: ...`, exit code 2) naming the option or argument as the
user wrote it and, where one is close, the option or command they probably meant.
`help.FleetGroup` raises them; `NoArgsIsHelpError` (a bare `gpufleet`, which prints the help) is
not a mistake and is left to click.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
from typing import Any

import typer

from gpufleet.errors import SpecError

# click's exceptions as typer raises them: typer 0.2x carries its own copy of click
# (`typer._click`), whose classes are not the installed click's.
clickx: Any = importlib.import_module(typer.BadParameter.__module__)

CLOSE = 0.7  # difflib's similarity from which a name counts as a likely typo of another


def closest(typed: str, names: Iterable[str]) -> str | None:
    """The name in `names` `typed` is most likely a typo of, or None. Compared without leading
    dashes, which every option shares and which would make `--epochs` look like `--detach`."""
    bare = {n.lstrip("-"): n for n in names}
    found = difflib.get_close_matches(typed.lstrip("-"), list(bare), n=1, cutoff=CLOSE)
    return bare[found[0]] if found else None


def _help(ctx: Any) -> str:
    return f"{ctx.command_path} --help" if ctx is not None else "gpufleet --help"


def _options(ctx: Any) -> list[str]:
    """The options the command takes, as a user may type them (hidden ones left out)."""
    if ctx is None:
        return []
    return [opt for p in ctx.command.get_params(ctx) if p.param_type_name == "option" and not p.hidden
            for opt in (*p.opts, *p.secondary_opts)]


def _param_name(param: Any) -> str:
    """An option as its first long flag (`--cluster`), an argument by its name (`job`)."""
    if param.param_type_name == "option":
        return str(next((o for o in param.opts if o.startswith("--")), param.opts[0]))
    return str(param.name)


def _sentence(text: str) -> str:
    """click's message as the tail of gpufleet's line: no capital, no final period."""
    text = " ".join(text.split()).rstrip(".")
    return text[:1].lower() + text[1:]


def no_such_command(ctx: Any, typed: str, commands: Iterable[str]) -> SpecError:
    near = closest(typed, commands)
    hint = f"did you mean {near}?" if near else f"{_help(ctx)} lists them"
    return SpecError([("command", f"'{typed}' is not a command of {ctx.command_path}; {hint}")])


def usage_error(exc: Any) -> SpecError:
    """The one-line error for what click refused on the command line."""
    ctx = exc.ctx
    if isinstance(exc, clickx.NoSuchOption):
        typed = exc.option_name
        near = closest(typed, _options(ctx))
        hint = f"did you mean {near}?" if near else f"{_help(ctx)} lists them."
        if ctx is not None and ctx.allow_extra_args and not hasattr(ctx.command, "commands"):
            # `run` and `bench scaling` hand what follows -- to the script (a group takes
            # extra arguments too: its command's)
            hint += f" A script's own options go after a --, e.g. -- {typed}"
        return SpecError([(typed, f"no such option of {_where(ctx)}; {hint.rstrip('.')}")])
    if isinstance(exc, clickx.MissingParameter) and exc.param is not None:
        return SpecError([(_param_name(exc.param), f"is required ({_help(ctx)})")])
    if isinstance(exc, clickx.BadParameter) and exc.param is not None:
        return SpecError([(_param_name(exc.param), _sentence(exc.message))])
    if isinstance(exc, clickx.BadOptionUsage):
        said = _sentence(exc.message).removeprefix(f"option '{exc.option_name}' ")
        return SpecError([(exc.option_name, said)])
    return SpecError([("arguments", f"{_sentence(exc.format_message())}; {_help(ctx)} shows the usage")])


def _where(ctx: Any) -> str:
    return ctx.command_path if ctx is not None else "gpufleet"
