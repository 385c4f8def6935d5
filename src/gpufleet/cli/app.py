"""The `gpufleet` app object and what every command shares: where output goes, JSON, asking
before acting, the store, and the launch quote.

Nothing heavy is imported here: each command imports the library it calls when it runs, so
`gpufleet --help`, `list` and `prices` start in a fraction of a second.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from gpufleet.cli.help import FleetCommand, FleetGroup

if TYPE_CHECKING:
    from gpufleet.lifecycle.provision import Approve
    from gpufleet.store import Store

app = typer.Typer(
    help="Carve GPU clusters out of this machine's pool and run distributed training on them.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, cls=FleetGroup,
)
COMMAND = FleetCommand  # the class of every command (`@app.command(cls=COMMAND)`)

# Piped output (scripts, `| grep`) gets wide lines instead of rich's 80-column default.
out = Console(width=None if Console().is_terminal else 160)
err = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 160)


def say(text: str) -> None:
    """What a library call has to tell the person at this terminal while it works (an
    engine's pending reason; `lifecycle.say`): one `gpufleet:` line on stderr."""
    sys.stderr.write(f"gpufleet: {text}\n")
    sys.stderr.flush()


def group(help_text: str) -> typer.Typer:
    """A command group (`pool`, `bench`), drawn like the app in --help."""
    return typer.Typer(help=help_text, no_args_is_help=True, cls=FleetGroup)


def print_json(data: Any) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def confirm(question: str, yes: bool) -> None:
    """Ask on a terminal (exit 1 on no); scripts and pipes, and `-y`, are not asked."""
    if yes or not sys.stdin.isatty():
        return
    if not typer.confirm(question, default=True):
        raise typer.Exit(1)


def store() -> Store:
    """The state file, with jobs whose supervisor died recorded as ended."""
    from gpufleet.lifecycle.provision import open_store

    return open_store()


def approve_quote(yes: bool, quiet: bool = False) -> Approve:
    """Show a launch's quote on stderr (unless `quiet`) and ask to go ahead."""
    from gpufleet import slot_words, ui
    from gpufleet.lifecycle.provision import Offer

    def approve(offer: Offer) -> None:
        spec, q = offer.spec, offer.quote
        spares = f" + {spec.spares} spare node(s)" if spec.spares else ""
        if not quiet:
            err.print(ui.quote_table(spec.gpu, spec.billed_count, offer.network, q.rates, q.book))
            if q.simulated:
                err.print(f"Simulated devices (pool {offer.pool or 'local'}): not billed; "
                          "the quote is what real ones would cost.")
            if spec.spares:
                err.print(f"The quote includes {spec.spares} spare node(s) of {spec.per_node}: "
                          "held free and warmed for a lost node, billed with the cluster.")
        confirm(f"Launch {slot_words.devices_shown(spec.gpu, spec.count)}{spares} at "
                f"{ui.usd(q.usd_per_hour)}/hour?", yes)

    return approve


def silence_stdout() -> None:
    """Point stdout at /dev/null after its reader went away, so exiting does not fail again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
