"""Ray token authentication for gpufleet's pools, kept inside `$GPUFLEET_HOME`.

Ray 2.52+ authenticates every RPC with one static token when `RAY_AUTH_MODE=token`. Ray looks
for it in `RAY_AUTH_TOKEN`, then `RAY_AUTH_TOKEN_PATH`, then `~/.ray/auth_token`. Relying on the
last one made pools work only where something earlier had happened to write that file, so each
pool keeps its own copy of its token in its state folder (`$GPUFLEET_HOME/pools/NAME/`,
owner-only) and every process that talks to the pool (raylets, the driver, discovery) is given
exactly that file through `RAY_AUTH_TOKEN_PATH`, with `RAY_AUTH_TOKEN` removed so a token the
user exported for another cluster cannot win over it.

A pool without a token gets `RAY_AUTH_MODE=disabled` for the same reason: a mode the user set
for some other cluster must not decide how gpufleet talks to this one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import SpecError

TOKEN_FILE = "ray-auth-token"
MODE, TOKEN, TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def pool_dir(home: Path, pool: str) -> Path:
    """The pool's own state folder; removed with the pool."""
    return home / "pools" / pool


def pool_token_path(home: Path, pool: str) -> Path:
    return pool_dir(home, pool) / TOKEN_FILE


def save_token(path: Path, token: str) -> Path:
    """Write `token` owner-only (folder 0700, file 0600), never readable by others even for
    a moment: the file is created with its mode rather than chmod-ed after the write."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.parent.chmod(0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return path


def new_token(path: Path) -> Path:
    """A fresh random token (256 bits, hex: the form `ray get-auth-token --generate` makes)."""
    return save_token(path, secrets.token_hex(32))


def forget(token_path: Path) -> None:
    """Remove a pool's token, and its state folder once nothing else is in it."""
    token_path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        token_path.parent.rmdir()


def auth_env(environ: Mapping[str, str], token_path: Path | None) -> dict[str, str]:
    """`environ` for a process of a pool: its token file when it has one, else auth off; never
    the user's own `RAY_AUTH_TOKEN` / `RAY_AUTH_TOKEN_PATH`, which name some other cluster's."""
    env = {k: v for k, v in environ.items() if k not in (TOKEN, TOKEN_PATH, MODE)}
    if token_path is None:
        env[MODE] = "disabled"
    else:
        env[MODE], env[TOKEN_PATH] = "token", str(token_path)
    return env


def use_here(token_path: Path | None) -> None:
    """`auth_env` applied to this process's own environment, where an in-process Ray client
    (`ray.init`) reads it."""
    wanted = auth_env(os.environ, token_path)
    for key in set(os.environ) - set(wanted):
        del os.environ[key]
    os.environ.update(wanted)


def env_token_path(environ: Mapping[str, str]) -> Path | None:
    """The token file `auth_env` put into a process's environment (None: auth off)."""
    if environ.get(MODE) == "token" and environ.get(TOKEN_PATH):
        return Path(environ[TOKEN_PATH])
    return None


@dataclass(frozen=True)
class GivenToken:
    """A token the user pointed `pool add` at, and where it came from (said in errors)."""

    token: str
    source: str


def _read(path: Path, field: str) -> str:
    try:
        text = path.expanduser().read_text().strip()
    except OSError as exc:
        raise SpecError([(field, f"cannot read {path}: {exc.strerror or exc}")]) from None
    if not text or len(text.split()) != 1:
        raise SpecError([(field, f"{path} does not hold a Ray token (one word, as "
                          "`ray get-auth-token` prints it)")])
    return text


def given_token(token_file: Path | None, environ: Mapping[str, str],
                home: Path) -> GivenToken | None:
    """The token for an existing Ray cluster, in Ray's own order after an explicit
    `--token-file`: `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`, then Ray's default file under the
    user's `home` (`~/.ray/auth_token`). None: the cluster is taken to need no token."""
    if token_file is not None:
        return GivenToken(_read(token_file, "token_file"), str(token_file))
    if environ.get(TOKEN, "").strip():
        return GivenToken(environ[TOKEN].strip(), f"${TOKEN}")
    if environ.get(TOKEN_PATH):
        return GivenToken(_read(Path(environ[TOKEN_PATH]), TOKEN_PATH), environ[TOKEN_PATH])
    default = home / ".ray" / "auth_token"
    if default.is_file():
        return GivenToken(_read(default, "token_file"), str(default))
    return None
