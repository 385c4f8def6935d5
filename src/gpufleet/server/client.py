"""The CLI's transport to the API: JSON over HTTP with the user's token, and the server's
errors turned back into the same one-line errors (and exit codes) a local command gives.
Commands do not call it themselves: `cli/client_server.py` does, one method per route.

Where the CLI finds a server: $GPUFLEET_SERVER and $GPUFLEET_TOKEN, else what `gpufleet login`
saved in $GPUFLEET_HOME/login.json (0600).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from gpufleet import errors
from gpufleet.server import API_VERSION, paths

LOGIN_FILE = "login.json"
TIMEOUT_S = 60.0
_KINDS: dict[str, type[errors.GpufleetError]] = {
    "SpecError": errors.GpufleetError, "NotFoundError": errors.NotFoundError,
    "ConflictError": errors.ConflictError, "AllocationError": errors.AllocationError,
    "StateError": errors.StateError, "ForbiddenError": errors.ForbiddenError,
    "NoToken": errors.ForbiddenError,
}


class Client:
    def __init__(self, url: str, token: str | None, timeout_s: float = TIMEOUT_S):
        self.url = url.rstrip("/")
        if token is not None and not (token.isascii() and token.isprintable()):
            raise errors.SpecError([("token", "a token is one line of printable ASCII; check "
                                     "the token file or $GPUFLEET_TOKEN")])
        self.token = token
        self.timeout_s = timeout_s
        self._checked = False

    def call(self, method: str, path: str, body: Any = None,
             query: dict[str, Any] | None = None) -> Any:
        if not self._checked and path != paths.VERSION:
            self.check_version()
        q = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.url + path + (f"?{urllib.parse.urlencode(q)}" if q else "")
        data = None if body is None else json.dumps(body).encode()
        try:
            req = urllib.request.Request(url, data=data, method=method)
        except ValueError as exc:  # a URL urllib cannot read (http://[::1, no scheme)
            raise errors.ServerError(f"server: '{errors.excerpt(self.url)}' is not a server "
                                     f"URL ({exc}); use http://HOST:PORT") from None
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise _error(exc) from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            why = getattr(exc, "reason", exc)
            raise errors.ServerError(f"server: cannot reach {self.url} ({why}); is `gpufleet "
                                     "server` running there? (gpufleet logout to work without "
                                     "it)") from None
        except ValueError:
            raise errors.ServerError(f"server: {self.url} did not answer with JSON; is it a "
                                     "gpufleet server?") from None

    def check_version(self) -> None:
        got = self.call("GET", paths.VERSION)
        api = got.get("api") if isinstance(got, dict) else None
        if api != API_VERSION:
            from gpufleet import __version__

            raise errors.ServerError(
                f"server: {self.url} speaks API v{api} (gpufleet {got.get('version', '?')}), "
                f"this gpufleet {__version__} speaks v{API_VERSION}; install the server's "
                "version of gpufleet, or ask its admin which one to use")
        self._checked = True


def _error(exc: urllib.error.HTTPError) -> errors.GpufleetError:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        body = {}
    message = body.get("error") if isinstance(body, dict) else None
    if not message:
        return errors.ServerError(f"server: HTTP {exc.code} {exc.reason} (not a gpufleet "
                                  "answer; is the URL right?)")
    return _KINDS.get(str(body.get("kind")), errors.GpufleetError)(message)


def login_path(home: Path) -> Path:
    return home / LOGIN_FILE


def configured(home: Path) -> Client | None:
    """The server this CLI talks to, if any."""
    url = os.environ.get("GPUFLEET_SERVER")
    token = os.environ.get("GPUFLEET_TOKEN")
    if url:
        return Client(url, token)
    try:
        saved = json.loads(login_path(home).read_text())
        return Client(saved["url"], saved.get("token"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_login(home: Path, url: str, token: str) -> Path:
    path = login_path(home)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url.rstrip("/"), "token": token}, f)
    path.chmod(0o600)
    return path
