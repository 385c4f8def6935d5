"""The driver of a multi-node run is a process tree on this machine: what every such engine
does with it, once.

Ray, Slurm and SSH pools start one local driver (`python -m gpufleet.backends.X_run PLAN`)
that reaches the nodes; the supervisor follows that driver as it follows a local torchrun.
`DriverProcs` gives an engine the Backend methods for it (start, poll, signal, kill_tree,
adopt_orphans, end_orphans) by handing them to a one-slot `LocalBackend`; an engine only says
which environment its driver needs (`driver_env`), e.g. a Ray pool's token, a Slurm pool's
SLURM_CONF.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.backends.base import Handle, Prepared
from gpufleet.backends.local import LocalBackend


class DriverProcs:
    """Mixed into an engine whose runs are a local driver process."""

    procs: LocalBackend

    def init_procs(self) -> None:
        self.procs = LocalBackend(cpu_slots=1)  # the driver is a local process tree

    def driver_env(self, env: dict[str, str]) -> dict[str, str]:
        """The driver's whole environment, from what the supervisor gives it."""
        return env

    def start(self, prepared: Prepared, env: dict[str, str], cwd: Path) -> Handle:
        return self.procs.start(prepared, self.driver_env(env), cwd)

    def poll(self, handle: Handle) -> int | None:
        return self.procs.poll(handle)

    def signal(self, handle: Handle, sig: int) -> None:
        self.procs.signal(handle, sig)

    def kill_tree(self, handle: Handle, grace_s: float = 10.0) -> None:
        self.procs.kill_tree(handle, grace_s)

    def adopt_orphans(self) -> None:
        self.procs.adopt_orphans()

    def end_orphans(self) -> None:
        self.procs.end_orphans()
