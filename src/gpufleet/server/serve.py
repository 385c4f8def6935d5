"""Running the server process: bind, start the loop, serve the API until stopped.

A team server (`gpufleet server --host ... --db ...`) makes an admin user on its first start
and writes that admin's token to a file only its owner can read. A local server (`--local`,
started by the CLI on demand) writes its address and an owner token to
$GPUFLEET_HOME/server.json instead, and exits once nothing has been queued or running for a
while.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from pathlib import Path

from sqlalchemy import select

from gpufleet.errors import SpecError
from gpufleet.lifecycle import accounts, owners
from gpufleet.server.loop import Loop
from gpufleet.store import Store, User

INFO_FILE = "server.json"
LOCAL_IDLE_S = 60.0


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or a one-line error: bound first so a busy port is not a server
    traceback."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, UnicodeError) as exc:
        busy = "in use" in str(exc)
        raise SpecError([("port" if busy else "host",
                          f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}"
                          + ("; pick another with --port, or --port 0 for any free one"
                             if busy else ""))]) from None
    return sock


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def first_admin(store: Store, token_file: Path) -> str | None:
    """On a server with no admin yet: make user 'admin' and write its token to `token_file`
    (0600); the message to print. None when an admin exists."""
    with store.read() as s:
        if s.scalar(select(User.id).where(User.admin.is_(True)).limit(1)) is not None:
            return None
    me = accounts.Identity("gpufleet-server", None, True)
    name = "admin"
    with store.read() as s:
        if s.scalar(select(User.id).where(User.name == name)) is not None:
            name = f"admin-{secrets.token_hex(2)}"
    token = accounts.add_user(store, me, name, None, True)
    _write_private(token_file, token + "\n")
    return (f"made admin user '{name}'; its token is in {token_file} (gpufleet login URL "
            f"--token-file {token_file}, then gpufleet admin user add NAME --team TEAM)")


def serve(store: Store, home: Path, host: str, port: int, local: bool,
          idle_exit_s: float | None, admin_token_file: Path | None) -> None:
    import uvicorn

    from gpufleet.server.api import create_api

    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"
    owner_token = secrets.token_urlsafe(32) if local else None
    server: uvicorn.Server | None = None

    def idle() -> None:
        if server is not None:
            server.should_exit = True

    loop = Loop(store, idle_exit_s if local else None, on_idle=idle)
    app = create_api(store, loop, owner_token)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    info = home / INFO_FILE
    if local:
        me = owners.me()
        _write_private(info, json.dumps({"url": url, "pid": me.pid, "started": me.started,
                                         "token": owner_token}))
    else:
        said = first_admin(store, admin_token_file or home / "admin-token")
        if said:
            print(f"gpufleet server: {said}", file=sys.stderr, flush=True)
    print(f"gpufleet server on {url} (api v1; store {store.url.split('@')[-1]})",
          file=sys.stderr, flush=True)
    loop.start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        loop.stop()
        if local:
            try:
                if json.loads(info.read_text()).get("pid") == os.getpid():
                    info.unlink()
            except (OSError, ValueError):
                pass
