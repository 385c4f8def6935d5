"""A backend for tests: runs no process. Each start calls a plain function (the handler, as
httpx's MockTransport takes one) with the run, and plays the worker events it yields in a
thread: output lines, datagrams to the supervisor's report socket, pauses, an exit code.

So the real supervisor loop, store and logs are driven through restarts, hangs and stops in
a fraction of a second, with no torchrun and no gloo.
"""

from __future__ import annotations

import itertools
import json
import os
import signal as signals
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpufleet.backends.base import Backend, Handle, Prepared, RunRequest
from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.backends.kinds import CAPABILITIES, Capabilities, Kind
from gpufleet.pool.model import Device, Node
from gpufleet.reportauth import Signer, signer_from_env


@dataclass(frozen=True)
class Line:
    """A line of output, as torchrun prints it: `[rank1]:text` for a worker's."""

    text: str


@dataclass(frozen=True)
class Send:
    """A datagram to the supervisor: a report ({"t", "rank", "step", ...}) or a note
    ({"event": "checkpoint", "rank", "step"}), signed with the run's key as a worker signs it;
    `signed=False` sends it bare, as a stranger on the machine would."""

    record: dict[str, Any]
    signed: bool = True


@dataclass(frozen=True)
class Pause:
    """Wait `seconds` (a stop or kill ends the wait, and the run)."""

    seconds: float


@dataclass(frozen=True)
class Exit:
    code: int


WorkerEvent = Line | Send | Pause | Exit


@dataclass(frozen=True)
class FakeRun:
    """What the handler is told about the run it plays."""

    number: int  # 1 for the first start of this backend, then 2, 3 ...
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    workers: int


Handler = Callable[[FakeRun], Iterable[WorkerEvent]]
_pids = itertools.count(4_000_000)  # above any real pid, so no one signals a real process


class FakeHandle:
    """A run being played: `stdout` is a real pipe, so the supervisor reads it as usual."""

    def __init__(self, run: FakeRun, events: Iterable[WorkerEvent], report_addr: str,
                 signer: Signer | None = None):
        self.run, self.signer = run, signer
        self._pid = next(_pids)
        read_fd, self._write_fd = os.pipe()
        self._stdout = os.fdopen(read_fd, "rb")
        self._code: int | None = None
        self._ended = threading.Event()  # a signal or a kill
        self._signal: int | None = None
        host, _, port = report_addr.rpartition(":")
        self._addr = (host or "127.0.0.1", int(port or 0))
        self._thread = threading.Thread(target=self._play, args=(events,), daemon=True,
                                        name=f"fake-run-{run.number}")
        self._thread.start()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def stdout(self) -> IO[bytes] | None:
        return self._stdout

    def poll(self) -> int | None:
        return None if self._thread.is_alive() else self._code

    def wait(self, timeout: float) -> int | None:
        self._thread.join(timeout)
        return self.poll()

    def end(self, sig: int) -> None:
        if self._signal is None:
            self._signal = sig
        self._ended.set()

    def _play(self, events: Iterable[WorkerEvent]) -> None:
        code = 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                for event in events:
                    if self._ended.is_set():
                        break
                    if isinstance(event, Line):
                        os.write(self._write_fd, (event.text.rstrip("\n") + "\n").encode())
                    elif isinstance(event, Send):
                        data = json.dumps(event.record).encode()
                        if event.signed and self.signer is not None:
                            data = self.signer.seal(data)
                        sock.sendto(data, self._addr)
                    elif isinstance(event, Pause):
                        self._ended.wait(event.seconds)
                    else:
                        code = event.code
                        break
            finally:
                os.close(self._write_fd)
                self._code = -self._signal if self._signal is not None else code


def cpu_node(devices: int = 4) -> Node:
    """A one-node pool of CPU slots, like this host's."""
    return Node(id="local", address="127.0.0.1", gpu_fabric="pcie", inter_fabric=None,
                free_disk_bytes=1 << 40,
                devices=tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=1 << 30)
                              for i in range(devices)))


@dataclass
class FakeBackend:
    """Plays `handler`'s events for every start. `lost` names nodes the next heal is told
    were lost; `starts` lists every run started, for assertions."""

    handler: Handler
    nodes: list[Node] = field(default_factory=lambda: [cpu_node()])
    capabilities: Capabilities = field(
        default_factory=lambda: Capabilities(**{**CAPABILITIES["local"].__dict__,
                                                "samples_devices": False}))
    lost: set[str] = field(default_factory=set)
    starts: list[FakeRun] = field(default_factory=list)
    kind: Kind = "local"
    pids_here: bool = False  # a fake pid names no process to inspect

    @property
    def name(self) -> str:
        return "fake"

    def discover(self) -> list[Node]:
        return list(self.nodes)

    def prepare(self, run: RunRequest) -> Prepared:
        return Prepared(["fake-workers", run.run_id, str(run.workers)],
                        {"GPUFLEET_REPORT_ADDR": run.ctx.report_addr,
                         "GPUFLEET_WORKERS": str(run.workers)})

    def start(self, prepared: Prepared, env: dict[str, str], cwd: Path) -> Handle:
        run = FakeRun(len(self.starts) + 1, prepared.argv, env, cwd, int(env.get("GPUFLEET_WORKERS", 1)))
        self.starts.append(run)
        return FakeHandle(run, self.handler(run), env["GPUFLEET_REPORT_ADDR"],
                          signer_from_env(env))

    def poll(self, handle: Handle) -> int | None:
        return handle.poll()

    def signal(self, handle: Handle, sig: int) -> None:
        if isinstance(handle, FakeHandle):
            handle.end(sig)

    def kill_tree(self, handle: Handle, grace_s: float = 10.0) -> None:
        if isinstance(handle, FakeHandle):
            handle.end(signals.SIGTERM)
        handle.wait(5.0)

    def adopt_orphans(self) -> None:
        pass  # no processes: nothing to adopt

    def end_orphans(self) -> None:
        pass

    def lost_nodes(self, job_dir: Path) -> set[str]:
        lost, self.lost = self.lost, set()
        return lost

    def node_lost(self, code: int, lines: list[str]) -> str | None:
        return next((ln for ln in reversed(lines) if ln.startswith("NodeLostError")), None) \
            if code == NODE_LOST_EXIT else None

    def report_host(self) -> str:
        return "127.0.0.1"


def as_backend(fake: FakeBackend) -> Backend:
    """A FakeBackend is a Backend (this line is mypy's check of that)."""
    return fake
