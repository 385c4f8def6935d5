"""The supervisor's report socket and the checks on what the process table says about a rank.

Kept apart from the loop (`supervisor.py`) because these are the edges the loop reads: a UDP
socket that any local process can send to (so everything on it is verified by `Intake` with the
job's key first), and psutil lookups of the pids that signed reports name.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping

import psutil

from gpufleet.reportauth import KEY_ENV


def open_socket(host: str = "127.0.0.1") -> socket.socket:
    """The UDP socket workers report to, on a free port of `host`, with a large receive buffer
    so a burst of reports waits in the kernel while we write to the store."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((host, 0))
    sock.setblocking(False)
    return sock


def pending(sock: socket.socket) -> Iterator[bytes]:
    """Every datagram waiting on the non-blocking socket now."""
    while True:
        try:
            yield sock.recv(65536)
        except (BlockingIOError, OSError):
            return


def holds_key(pid: int, key: str) -> bool:
    """Whether `pid` is a process here whose environment carries this job's report key.

    A reported pid is taken (for the hang check's stopped test and CPU telemetry) only then: a
    signed report can still carry a wrong pid (a script's bug), and sampling a stranger's
    process would be worse.
    """
    try:
        return psutil.Process(pid).environ().get(KEY_ENV) == key
    except psutil.Error:
        return False


def stopped(pids: Mapping[int, int]) -> dict[int, bool]:
    """Each rank's process: stopped (SIGSTOP, a debugger) or not (gone counts as not)."""
    out: dict[int, bool] = {}
    for rank, pid in pids.items():
        try:
            out[rank] = psutil.Process(pid).status() == psutil.STATUS_STOPPED
        except psutil.Error:
            out[rank] = False
    return out
