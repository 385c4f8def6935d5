"""`server` (the team's queue, users and ledger behind an API), `login` and `logout`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.app import COMMAND, app, err, out
from gpufleet.errors import SpecError


@app.command(cls=COMMAND)
def server(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port (0: any free one).",
                                      min=0, max=65535)] = 8480,
    db: Annotated[str | None, typer.Option(
        "--db", help="Database URL, e.g. postgresql://user@host/gpufleet."
        " \\[default: the SQLite file in $GPUFLEET_HOME]")] = None,
    admin_token_file: Annotated[Path | None, typer.Option(
        "--admin-token-file", help="Where the first admin's token is written on the first "
        "start. \\[default: $GPUFLEET_HOME/admin-token]")] = None,
    local: Annotated[bool, typer.Option("--local", hidden=True)] = False,
    idle_exit: Annotated[float | None, typer.Option("--idle-exit", hidden=True)] = None,
) -> None:
    """Serve the queue, users, quotas, budgets and ledger to a team: start it once, then each
    member runs gpufleet login URL --token-file FILE."""
    from gpufleet.lifecycle import reconcile
    from gpufleet.server.serve import LOCAL_IDLE_S, serve
    from gpufleet.store import Store, gpufleet_home

    home = gpufleet_home()
    if db is not None and not db.startswith(("postgresql", "sqlite")):
        raise SpecError([("db", f"'{db}' is not a database URL; allowed: postgresql://... or "
                          "sqlite:///PATH")])
    if db:  # the supervisors this server starts open the same database
        import os

        from gpufleet.store.db import DB_ENV

        os.environ[DB_ENV] = db
    st = Store(db) if db else Store()
    reconcile.reconcile(st)
    serve(st, home, "127.0.0.1" if local else host, 0 if local else port, local,
          idle_exit if idle_exit is not None else (LOCAL_IDLE_S if local else None),
          admin_token_file)


@app.command(cls=COMMAND)
def login(
    url: Annotated[str, typer.Argument(help="The server, e.g. http://gpu-box:8480.")],
    token_file: Annotated[Path, typer.Option(
        "--token-file", help="File holding your token ('-': read it from stdin).")],
) -> None:
    """Point this CLI at a gpufleet server: run, jobs, cancel, stop, status, logs, usage and
    admin then go through it."""
    from gpufleet.home import home_path
    from gpufleet.server import paths
    from gpufleet.server.client import Client, save_login
    from gpufleet.store import gpufleet_home

    if not url.startswith(("http://", "https://")):
        raise SpecError([("url", f"'{url}' is not a server URL; use http://HOST:PORT")])
    try:
        token = (sys.stdin.read() if str(token_file) == "-" else token_file.read_text()).strip()
    except OSError as exc:
        raise SpecError([("token_file", f"cannot read {token_file}: {exc.strerror}")]) from None
    if not token:
        raise SpecError([("token_file", f"{token_file} is empty")])
    me = Client(url, token).call("GET", paths.WHOAMI)
    gpufleet_home()
    path = save_login(home_path(), url, token)
    out.print(f"Logged in to {url} as {me['user']}" + (f" (team {me['team']})" if me.get("team")
                                                       else "") + (", an admin" if me["admin"]
                                                                   else "")
              + f"; saved in {path}", highlight=False)


@app.command(cls=COMMAND)
def logout() -> None:
    """Forget the server: commands work on this machine's own state again."""
    from gpufleet.home import home_path
    from gpufleet.server.client import login_path

    path = login_path(home_path())
    if path.exists():
        path.unlink()
        out.print("Logged out; commands use this machine's state again.")
    else:
        err.print("Not logged in to a server.")
