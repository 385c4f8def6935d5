"""Whether other nodes' agents are still connected to the rendezvous store this launcher hosts.

A multi-node job's head node hosts torchrun's c10d store in its launcher process. When the job
ends every agent closes the rendezvous through that store (`shutdown()` in torch's launcher,
after the exit barrier). The warm launcher ends with `os._exit` (launch/warm.py: no 0.9 s
interpreter teardown), so the head could be gone while another node was still closing: that
node then logged "failed to shutdown the rendezvous ... RendezvousConnectionError" at the end
of a job that had succeeded (seen 1 run in 3 on the test Slurm under load). So the head waits,
bounded, until no other process holds a connection to its store; and the store must outlive
`torchrun.main` for that (torch frees it, and its server stops, as the launcher returns:
launch/warm.py `_store_outlives_the_run`). Plain torchrun (`--no-warm`) has the same race.

Read from /proc/net/tcp{,6} and /proc/self/fd, not psutil: the launcher may run in a job's
container image, which has Python and torch but not gpufleet's dependencies.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

ESTABLISHED = "01"
PEERS_GONE_S = 10.0  # the most the head waits; a peer's close takes a moment, not seconds


@dataclass(frozen=True)
class Conn:
    local: tuple[str, int]  # (hex address as the kernel writes it, port)
    remote: tuple[str, int]
    established: bool
    inode: int


_MAPPED = "0000000000000000FFFF0000"  # an IPv4 address in tcp6, as the kernel writes it


def parse(text: str) -> list[Conn]:
    """The connections of one /proc/net/tcp or tcp6 table (pure). An IPv4-mapped address of
    tcp6 is written as tcp's, so a store listening on both families still matches this
    process's own IPv4 client to the socket it accepted."""
    def endpoint(field: str) -> tuple[str, int]:
        addr, port = field.rsplit(":", 1)
        return (addr[len(_MAPPED):] if addr.upper().startswith(_MAPPED) else addr, int(port, 16))

    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        out.append(Conn(endpoint(f[1]), endpoint(f[2]), f[3] == ESTABLISHED, int(f[9])))
    return out


def peers(conns: Iterable[Conn], port: int, mine: set[int]) -> list[Conn]:
    """The connections into this process's store on `port` that come from another process
    (pure): the store's accepted sockets are this process's (`mine`: its socket inodes); this
    process's own clients of the store are left out by their endpoints."""
    conns = [c for c in conns if c.established]
    own_clients = {c.local for c in conns if c.remote[1] == port and c.inode in mine}
    return [c for c in conns if c.local[1] == port and c.inode in mine
            and c.remote not in own_clients]


def store_port(torchrun_args: Sequence[str]) -> int | None:
    """The store's port when this launcher hosts a multi-node rendezvous (`--rdzv-conf
    is_host=1` and `--rdzv-endpoint HOST:PORT`), else None (pure)."""
    def value(*names: str) -> str | None:
        for i, a in enumerate(torchrun_args):
            for n in names:
                if a == n and i + 1 < len(torchrun_args):
                    return torchrun_args[i + 1]
                if a.startswith(n + "="):
                    return a.split("=", 1)[1]
        return None

    if "--standalone" in torchrun_args:
        return None
    conf = value("--rdzv-conf", "--rdzv_conf") or ""
    endpoint = value("--rdzv-endpoint", "--rdzv_endpoint") or ""
    if "is_host=1" not in conf.split(",") or not endpoint.rpartition(":")[2].isdigit():
        return None
    return int(endpoint.rpartition(":")[2])


def _socket_inodes() -> set[int]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own fd among them)
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def _tables() -> list[Conn]:
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                out += parse(f.read())
        except OSError:
            continue
    return out


def wait_gone(port: int, timeout_s: float = PEERS_GONE_S,
              look: Callable[[], list[Conn]] | None = None,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> int:
    """Wait until no other process is connected to the store on `port`, at most `timeout_s`;
    how many still were at the end (0: all gone). Never raises: a /proc that cannot be read
    is no reason to keep a finished launcher alive."""
    def connected() -> int:
        try:
            return len(look() if look is not None else peers(_tables(), port, _socket_inodes()))
        except (OSError, ValueError):
            return 0

    deadline = clock() + timeout_s
    left = connected()
    while left and clock() < deadline:
        sleep(0.05)
        left = connected()
    return left
