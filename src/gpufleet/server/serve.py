"""Running the server process: bind, start the loop, serve the API until stopped.

A team server (`gpufleet server --host ... --db ...`) makes an admin user on its first start
and writes that admin's token to a file only its owner can read. A local server (`--local`,
started by the CLI on demand) writes its address and an owner token to
$GPUFLEET_HOME/server.json instead, and exits once nothing has been queued or running for a
while.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from gpufleet.errors import SpecError, StateError
from gpufleet.lifecycle import accounts, owners
from gpufleet.server.loop import Loop
from gpufleet.store import Store, User

INFO_FILE = "server.json"
LOCK_FILE = "server.lock"  # taken to start a local server, or to end one
RUN_LOCK_FILE = "server.run.lock"  # held by the one server of this state folder
SERVER_LOCK_KEY = 0x67707573  # the PostgreSQL advisory lock of the one server of a database
LOCAL_IDLE_S = 60.0


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or a one-line error: bound first so a busy port is not a server
    traceback."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # clients that connect once the address is printed wait, not fail
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
    guard = only_server(store, home)
    owner_token = secrets.token_urlsafe(32)  # for this OS user's own CLI (server.json, 0600)
    server: uvicorn.Server | None = None
    info = home / INFO_FILE

    def idle(broken: bool) -> bool:
        """End a local server, unless a job was queued since the loop looked: under the lock
        `local.ensure` takes, so a CLI either sees this server gone or sees it take its job."""
        with open(home / LOCK_FILE, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not broken and _busy(store):
                return False
            _forget(info)
        if server is not None:
            server.should_exit = True
        return True

    loop = Loop(store, idle_exit_s if local else None, on_idle=idle)
    app = create_api(store, loop, owner_token)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    me = owners.me()
    _write_private(info, json.dumps({"url": url, "pid": me.pid, "started": me.started,
                                     "token": owner_token, "local": local}))
    if not local:
        said = first_admin(store, admin_token_file or home / "admin-token")
        if said:
            print(f"gpufleet server: {said}", file=sys.stderr, flush=True)
    print(f"gpufleet server on {url} (api v1; store {_shown(store)})",
          file=sys.stderr, flush=True)
    from gpufleet.lifecycle import dispatch

    back = dispatch.requeue_unstarted(store)
    if back:
        print(f"gpufleet server: queued again (a server ended while starting them): "
              f"{', '.join(back)}", file=sys.stderr, flush=True)
    loop.start()
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        loop.stop()
        _forget(info)
        guard.close()


def _forget(info: Path) -> None:
    """Remove server.json if it is this server's."""
    try:
        if json.loads(info.read_text()).get("pid") == os.getpid():
            info.unlink()
    except (OSError, ValueError):
        pass


def _busy(store: Store) -> bool:
    from gpufleet.status import JOB_ACTIVE, QueueStatus
    from gpufleet.store import Job, QueuedJob

    with store.read() as s:
        return bool(s.scalar(select(QueuedJob.id).where(QueuedJob.status == QueueStatus.QUEUED)
                             .limit(1)) or
                    s.scalar(select(Job.id).where(Job.status.in_(JOB_ACTIVE)).limit(1)))


class Guard:
    """What keeps a second server off the same store while this one runs."""

    def __init__(self, close: Callable[[], None]):
        self.close = close


def only_server(store: Store, home: Path, wait_s: float = 5.0) -> Guard:
    """Hold the store for this server: two would both start the queue's jobs, and judge each
    other's supervisors (on another host) dead. A file lock in the state folder for SQLite, a
    session advisory lock for PostgreSQL, held until the server ends. A server that is just
    ending (idle) is waited for a little."""
    import time

    deadline = time.monotonic() + wait_s
    if store.path is None:  # a database server: one lock per database, on a session of its
        # own outside any transaction (the store's write transactions take another lock)
        from sqlalchemy import create_engine

        from gpufleet.store import postgres

        engine = create_engine(postgres.engine_url(store.url), isolation_level="AUTOCOMMIT",
                               connect_args=postgres.connect_args(store.url))
        conn = engine.connect()
        while not conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({SERVER_LOCK_KEY})").scalar():
            if time.monotonic() > deadline:
                conn.close()
                engine.dispose()
                raise StateError(f"server: another gpufleet server uses {_shown(store)}; one "
                                 "server per database")
            time.sleep(0.2)

        def release() -> None:
            conn.close()
            engine.dispose()

        return Guard(release)
    handle = open(home / RUN_LOCK_FILE, "a+")  # noqa: SIM115 (held until the server ends)
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return Guard(handle.close)
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                raise StateError(f"server: another gpufleet server serves {home} (see "
                                 f"{home / INFO_FILE}); one server per state folder") from None
            time.sleep(0.2)


def _shown(store: Store) -> str:
    return store.url.split("@")[-1]
