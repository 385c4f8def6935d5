"""How gpufleet reaches a host of an SSH pool: the host's record and the ssh command lines.

Pure: a `Host` (what the pool stores of one machine) and the pool's pinned host keys in, an
`ssh` argv out. Every connection is made the way an ssh user expects from a tool that runs
unattended:

- `BatchMode=yes`: never a password or passphrase prompt; a key that is refused is an error;
- `StrictHostKeyChecking=yes` against the pool's own known_hosts file (keys pinned at `pool
  add`), never the user's ~/.ssh/known_hosts and never accept-new: a changed key refuses the host;
- the private key is referred to by path (`-i PATH`, `IdentitiesOnly`), never read by gpufleet;
- `ServerAliveInterval=1`, `ServerAliveCountMax=3`: a host that is killed or cut off ends its
  connection within about 4 s, which is how a run notices a lost host;
- one multiplexed connection per host (`ControlMaster`/`ControlPath`), so a run's many commands to
  a host (ship, setup, start, stop) pay for one handshake.

A hostfile has one host per line, as DeepSpeed's (`HOST slots=N`), with optional keys of our own:
`gpu=TYPE user=U port=P identity=PATH python=PATH`; `#` starts a comment.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HOSTFILE_KEYS = ("slots", "gpu", "user", "port", "identity", "python")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]*$|^\[?[0-9a-fA-F:]+\]?$")


@dataclass(frozen=True)
class Host:
    """One machine of an SSH pool, as stored with the pool."""

    address: str
    port: int = 22
    user: str | None = None  # None: ssh's default (the local user, or ~/.ssh/config)
    identity: str | None = None  # a private key's path; the key itself is never read here
    slots: int | None = None  # CPU worker slots (None: discovered: the host's cores)
    gpu: str | None = None  # the GPU type, when discovery cannot name it
    python: str = "python3"  # the node's interpreter with torch and gpufleet

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}" if self.user else self.address

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Host:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")


def check_user(user: str) -> str:
    """A login name; never one that ssh would read as an option (`-oProxyCommand=...`)."""
    if not _USER.match(user):
        raise ValueError(f"'{user}' is not a user name (letters, digits, '.', '_', '-'; not "
                         "starting with '-')")
    return user


def check_host(address: str) -> str:
    if not _HOST.match(address):
        raise ValueError(f"'{address}' is not a host name or an IP address")
    return address


def parse_hostfile(text: str, defaults: Host) -> list[Host]:
    """The hosts of a hostfile, each with `defaults`' user, port, identity and python unless its
    line says otherwise. A bad line is a ValueError naming the line and what is allowed."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        first, *rest = line.split()
        where = f"hostfile line {number}"
        try:
            check_host(first)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        fields: dict[str, Any] = {}
        for item in rest:
            key, eq, value = item.partition("=")
            if not eq or not value:
                raise ValueError(f"{where}: '{item}' is not KEY=VALUE; keys: "
                                 + ", ".join(HOSTFILE_KEYS))
            if key not in HOSTFILE_KEYS:
                raise ValueError(f"{where}: unknown key '{key}'; allowed: "
                                 + ", ".join(HOSTFILE_KEYS))
            if key == "user":
                try:
                    check_user(value)
                except ValueError as e:
                    raise ValueError(f"{where}: user={e}") from None
            if key in ("slots", "port"):
                if not value.isdigit() or int(value) < 1 or (key == "port" and int(value) > 65535):
                    limit = "1-65535" if key == "port" else "a whole number >= 1"
                    raise ValueError(f"{where}: {key}={value} is not allowed; allowed: {limit}")
                fields[key] = int(value)
            else:
                fields[key] = value
        if any(h.address == first and h.port == fields.get("port", defaults.port)
               for h in hosts):
            raise ValueError(f"{where}: host {first} is listed twice")
        hosts.append(Host(address=first, port=fields.get("port", defaults.port),
                          user=fields.get("user", defaults.user),
                          identity=fields.get("identity", defaults.identity),
                          slots=fields.get("slots", defaults.slots), gpu=fields.get("gpu"),
                          python=fields.get("python", defaults.python)))
    if not hosts:
        raise ValueError("hostfile: no hosts in it (one per line: HOST slots=N)")
    return hosts


def options(host: Host, known_hosts: Path, control_dir: Path | None = None,
            connect_timeout_s: int = 5) -> list[str]:
    """The `-o` options and flags for `host` (everything before the destination)."""
    opts = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", f"ConnectTimeout={connect_timeout_s}", "-o", "ServerAliveInterval=1",
            "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR", "-p", str(host.port)]
    if host.identity:
        opts += ["-i", host.identity, "-o", "IdentitiesOnly=yes"]
    if control_dir is not None:  # %C: a hash of the connection, short enough for a socket path
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C",
                 "-o", "ControlPersist=30"]
    return opts


def ssh_argv(host: Host, known_hosts: Path, remote: list[str], control_dir: Path | None = None,
             tty: bool = False, connect_timeout_s: int = 5) -> list[str]:
    """`ssh ... HOST -- REMOTE`: `remote` is quoted for the remote shell, word by word."""
    return ["ssh", *options(host, known_hosts, control_dir, connect_timeout_s),
            *(["-t"] if tty else ["-T"]), host.target, "--", shlex.join(remote)]
