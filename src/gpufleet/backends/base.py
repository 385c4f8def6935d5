"""The one interface every engine implements.

Code outside `backends/` calls this protocol and reads `backend.capabilities` (what each kind
can do is in `kinds.py`); it never compares a backend's name. A new engine (Kubernetes, SSH)
is a new module here that mypy checks against `Backend` (and `alloc.Allocating` if it grants
the nodes itself), a row in `kinds.CAPABILITIES` and its entry in `registry.ENGINES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from gpufleet.backends.kinds import Capabilities, Kind
from gpufleet.launch.container import Container
from gpufleet.launch.torchrun import JobContext
from gpufleet.parallelism import Layout
from gpufleet.pool.model import Node, Placement
from gpufleet.spec import JobSpec


@runtime_checkable
class Handle(Protocol):
    """A started worker group, as the supervisor follows it."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float) -> int | None: ...


@dataclass(frozen=True)
class RunRequest:
    """One run of a job's worker group, as the supervisor asks a backend to prepare it."""

    spec: JobSpec  # workers_per_node already set to the current size of an elastic job
    layout: Layout
    placements: list[Placement]  # the cluster's reservation by node, head first
    workers: int  # the size of this run (a one-node backend takes that many devices)
    ctx: JobContext
    job_dir: Path
    run_id: str  # unique per run: a rendezvous id that a late node of the last run cannot join
    survive_env: dict[str, str]  # checkpoint folder, control file, run number, grad accumulation
    cluster_name: str
    cluster_devices: int  # devices the cluster holds in all (host memory is shared by slots)
    engine_ref: str = ""  # the cluster's allocation in an allocating engine (a Slurm job id)
    # spare nodes the cluster holds beside `placements` (`--spares`): an engine that ships a
    # workdir warms them (ships it, runs the setup) while the run goes on
    spares: list[Placement] = field(default_factory=list)
    spared: bool = False  # launched with spares: a node may hold the job's mark from then

    @property
    def final(self) -> bool:
        """Whether this run is the job's last (runs are numbered from 1, and the last one the
        job may have is max_restarts + 1): the nodes and spares let the job's workdir go after
        it."""
        return int(self.survive_env.get("GPUFLEET_RUN", "1")) > self.spec.max_restarts


@dataclass(frozen=True)
class Prepared:
    """A run ready to start: one command (torchrun, a framework launcher, or the driver that
    starts one per node), its environment, and the files it reads (framework configs, a plan),
    written by the caller into the job folder before `start`."""

    argv: list[str]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)
    # a one-node engine's launcher inside this image (launch/container.py); a multi-node
    # engine's driver runs on the host and each node plan carries the image instead
    container: Container | None = None
    run_id: str = ""
    # what else must be the same for a waiting launcher to take the next run in place
    # (launch/warm_restart.py) where `argv` is not all of it: a driver's nodes and devices
    shape: str = ""


class Backend(Protocol):
    """Discover nodes; prepare, start, poll, signal and stop a worker group; say which nodes
    were lost and where workers report. Everything the supervisor does with an engine."""

    kind: Kind
    capabilities: Capabilities

    @property
    def name(self) -> str:
        """The kind, under its older name (the CLI still says `backend.name`)."""
        ...

    def discover(self) -> list[Node]: ...

    def prepare(self, run: RunRequest) -> Prepared:
        """The command, environment (what gpufleet adds) and files of one run."""
        ...

    def start(self, prepared: Prepared, env: dict[str, str], cwd: Path) -> Handle:
        """Start the run `prepare` returned: its `argv` in `cwd` with `env`, the whole
        environment it gets (its `env` merged over this process's and the job's own)."""
        ...

    def poll(self, handle: Handle) -> int | None: ...

    def signal(self, handle: Handle, sig: int) -> None: ...

    def kill_tree(self, handle: Handle, grace_s: float = 10.0) -> None: ...

    def adopt_orphans(self) -> None:
        """From now on, workers whose launcher died re-parent to this process (the supervisor),
        so `end_orphans` can still end them."""
        ...

    def end_orphans(self) -> None:
        """Kill whatever the runs left behind below this process."""
        ...

    def lost_nodes(self, job_dir: Path) -> set[str]:
        """Nodes the last run lost (read once: a second call says none), for a heal."""
        ...

    def node_lost(self, code: int, lines: list[str]) -> str | None:
        """The line saying the run lost a node, if its exit (`code`, the launcher's last
        `lines`) was that: its peers' errors are then knock-on effects, not the cause."""
        ...

    def report_host(self) -> str:
        """The address of this machine that the job's workers can send reports to."""
        ...

    @property
    def pids_here(self) -> bool:
        """Whether a worker pid in a report names a process on this machine."""
        ...


@runtime_checkable
class NodeShell(Protocol):
    """An engine whose nodes are reached by a command of its own (srun into an allocation, ssh
    with a pool's pinned keys), for `gpufleet ssh` and `doctor --cluster`: `argv` on node
    `node_id` (inside allocation `ref` where the engine allocates) with `env` set there;
    returns the local command line and its environment."""

    def shell(self, ref: str, node_id: str, argv: list[str],
              env: dict[str, str]) -> tuple[list[str], dict[str, str]]: ...


@dataclass(frozen=True)
class Reach:
    """Whether a node opened a TCP connection to `address`:`port`, over which interface."""

    address: str
    port: int
    ok: bool
    dev: str = ""  # the interface the node's route to `address` leaves from
    src: str = ""  # the node's own address on it
    error: str = ""


@runtime_checkable
class Reaches(Protocol):
    """An engine that can ask a node which addresses it reaches (`doctor --cluster`): the other
    nodes `peers` (at the port the engine reaches them on) and each of `extra` (ADDRESS, PORT).
    Raises ConnectionError, with the reason in one line, when the node cannot be asked."""

    def reach(self, node_id: str, peers: list[str],
              extra: list[tuple[str, int]]) -> list[Reach]: ...

    def report_host(self) -> str: ...
