"""`dashboard`: the web page, JSON API and /metrics, served until Ctrl-C."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.app import COMMAND, app, err, store
from gpufleet.cli.options import default
from gpufleet.errors import SpecError


@app.command(cls=COMMAND)
def dashboard(
    name: Annotated[str | None, typer.Argument(
        help="A cluster or job to open the page on." + default("the newest job"))] = None,
    port: Annotated[int, typer.Option("--port", "-p", help="Port to serve on (0: any free).",
                                      min=0, max=65535)] = 8470,
    host: Annotated[str, typer.Option(
        "--host", help="Address to bind. Anything but loopback requires the token printed "
        "at start (kept in $GPUFLEET_HOME/dashboard-token).")] = "127.0.0.1",
) -> None:
    """Serve the live dashboard: every cluster and job, charts, cost, ETA, diagnosis; a JSON
    API under /api and Prometheus metrics at /metrics."""
    import socket

    import uvicorn

    from gpufleet.store import gpufleet_home
    from gpufleet.views import check_name
    from gpufleet.web import auth
    from gpufleet.web.app import create_app

    st = store()
    if name is not None:
        check_name(st, name)
    token = None if auth.is_loopback(host) else auth.token(gpufleet_home())
    try:  # bind first, so a busy port is one clear line, not a server traceback
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # listening before the address is printed: a client that reads it and connects at once
        # waits in the backlog until the app is up, instead of being refused
        sock.listen(128)
    except (OSError, UnicodeError) as exc:
        raise SpecError([("port" if "in use" in str(exc) else "host",
                          f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}"
                          + ("; pick another with --port, or --port 0 for any free one"
                             if "in use" in str(exc) else ""))]) from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/"
    err.print(f"gpufleet dashboard on {url}" + (f"?token={token}" if token else "")
              + "   (Ctrl-C to stop)", highlight=False, soft_wrap=True)
    if token:
        err.print(f"API and /metrics need 'Authorization: Bearer {token}'", highlight=False,
                  soft_wrap=True)
    config = uvicorn.Config(create_app(st, token=token, focus=name, bound=host),
                            log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
