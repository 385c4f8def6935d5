"""Who may read the dashboard.

On 127.0.0.1 (the default) anyone on this machine may, as with any local tool. Bound to any
other address, every request needs the token kept owner-only in $GPUFLEET_HOME: as a bearer
header (Prometheus' `authorization` setting), as `?token=` once in the browser (which then
gets it as a cookie), or as that cookie.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

TOKEN_FILE = "dashboard-token"
COOKIE = "gpufleet_token"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: treat as reachable from outside


def token(home: Path) -> str:
    """The dashboard token, made on first use (32 random bytes, file mode 0600)."""
    path = home / TOKEN_FILE
    try:
        value = path.read_text().strip()
        if value:
            return value
    except FileNotFoundError:
        pass
    value = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    path.chmod(0o600)
    return value


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def host_allowed(host_header: str | None, bound: str) -> bool:
    """A dashboard without a token answers only requests addressed to a loopback name: a web
    page elsewhere could otherwise point its own DNS name at 127.0.0.1 (DNS rebinding) and read
    the API from the user's browser."""
    if not host_header:
        return False
    host = host_header.strip()
    if host.startswith("["):  # [::1]:8470
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.lower() in LOOPBACK_NAMES or host == bound


def presented(header: str | None, cookie: str | None, query: str | None) -> str | None:
    """The token a request carries, from the Authorization header, the cookie or ?token=."""
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return query or cookie


def allowed(expected: str | None, given: str | None) -> bool:
    if expected is None:
        return True
    return given is not None and secrets.compare_digest(expected.encode(), given.encode())
