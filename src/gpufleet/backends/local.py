"""This host as a one-node pool: NVIDIA GPUs through NVML, plus CPU worker slots for gloo.

CPU slots let the same code path run without a GPU: each slot is one worker process. Their number
is `cpu_slots`, else $GPUFLEET_CPU_SLOTS, else the number of cores.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import psutil

from gpufleet import catalog
from gpufleet.backends import base, keeper
from gpufleet.backends.base import Prepared, RunRequest
from gpufleet.backends.kinds import CAPABILITIES, Capabilities, Kind
from gpufleet.backends.node_image import in_image
from gpufleet.backends.proc_tree import end_kept, kill, send_signal, tree
from gpufleet.errors import SpecError
from gpufleet.launch import frameworks, warm_restart
from gpufleet.launch.container import Container, NodeSide, container_of
from gpufleet.pool.model import Device, Node
from gpufleet.slot_words import MAX_SLOTS

NODE_ID = "local"
ADDRESS = "127.0.0.1"


def cpu_slot_count(cpu_slots: int | None = None) -> int:
    """Slots asked for (option, then environment), else the cores, capped at the job limit."""
    if cpu_slots is not None:
        value: int | str = cpu_slots
    elif os.environ.get("GPUFLEET_CPU_SLOTS"):
        value = os.environ["GPUFLEET_CPU_SLOTS"]
    else:
        return max(1, min(os.cpu_count() or 1, MAX_SLOTS))
    try:
        n = int(value)
    except ValueError:
        raise SpecError([("GPUFLEET_CPU_SLOTS", f"'{value}' is not a whole number")]) from None
    if not 1 <= n <= MAX_SLOTS:
        raise SpecError([("cpu_slots", f"got {n}; must be 1 to {MAX_SLOTS}")])
    return n


def nvml_devices() -> tuple[list[Device], str]:
    """GPUs NVML sees, with catalog type, memory and NVLink peers; ([], 'pcie') without NVML.

    The fabric is nvswitch when any NVLink ends at a switch, nvlink when GPUs link directly.
    """
    try:
        import pynvml
    except ImportError:
        return [], "pcie"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return [], "pcie"
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus_to_index = {
            bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId): i for i, h in enumerate(handles)
        }
        devices: list[Device] = []
        fabric = "pcie"
        for i, h in enumerate(handles):
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            gpu = catalog.gpu_from_nvml_name(name)
            peers: set[int] = set()
            for remote_bus, to_switch in nvlink_remotes(pynvml, h):
                if to_switch:
                    fabric = "nvswitch"
                peer = bus_to_index.get(remote_bus)
                if peer is not None and peer != i:
                    peers.add(peer)
            if fabric == "nvswitch":
                peers = set(range(count)) - {i}
            elif peers:
                fabric = "nvlink"
            devices.append(Device(
                id=f"gpu{i}", index=i, gpu=gpu.name if gpu else f"unknown:{name}",
                memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                nvlink_peers=tuple(sorted(peers)), healthy=gpu is not None,
            ))
        return devices, fabric
    finally:
        pynvml.nvmlShutdown()


def nvlink_remotes(nvml: Any, handle: Any) -> list[tuple[str, bool]]:
    """Each active NVLink of a GPU: (the remote end's PCI bus id, whether it is an NVSwitch).
    Links NVML cannot describe are skipped."""
    switch = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    out = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except nvml.NVMLError:
            continue
        out.append((bus_id(remote.busId), kind == switch))
    return out


def bus_id(raw: bytes | str) -> str:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return text.lower().lstrip("0")


@dataclass
class Handle:
    """A started process tree: the keeper, torchrun below it and the workers in their own
    sessions; `lifeline` is the pipe end whose closing (or our death) makes the keeper end them."""

    proc: subprocess.Popen[bytes]
    lifeline: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout(self) -> IO[bytes] | None:
        return self.proc.stdout

    def poll(self) -> int | None:
        return self._ended(self.proc.poll())

    def wait(self, timeout: float) -> int | None:
        try:
            return self._ended(self.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            return None

    def _ended(self, code: int | None) -> int | None:
        if code is not None and self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None
        return code


class LocalBackend:
    """This host: torchrun (or the job's framework launcher) as a local process tree."""

    kind: Kind = "local"
    name = "local"
    capabilities: Capabilities = CAPABILITIES["local"]
    pids_here = True  # workers run here, so the pids in their reports are ours to inspect

    def __init__(self, cpu_slots: int | None = None, state_dir: Path | None = None):
        self.cpu_slots = cpu_slot_count(cpu_slots)
        self.state_dir = state_dir
        self.sides: dict[str, NodeSide] = {}  # an image's node facts, found at its first start

    def discover(self) -> list[Node]:
        gpus, fabric = nvml_devices()
        host_mem = psutil.virtual_memory().total
        cpus = [
            Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=host_mem // self.cpu_slots)
            for i in range(self.cpu_slots)
        ]
        disk_path = self.state_dir or Path.home()
        return [Node(
            id=NODE_ID, address=ADDRESS, devices=tuple(gpus + cpus), gpu_fabric=fabric,
            inter_fabric=None, free_disk_bytes=shutil.disk_usage(disk_path).free,
        )]

    def prepare(self, run: RunRequest) -> Prepared:
        """The framework's launcher on the first `run.workers` devices of the one node."""
        first = run.placements[0]
        placement = replace(first, devices=first.devices[: run.workers])
        cmd = frameworks.build(run.spec, run.layout, placement, run.ctx, port=free_port())
        if run.spec.warm and run.spec.framework in frameworks.WARM_FRAMEWORKS:
            # the supervisor, on this host, hands a restart to the running launcher
            cmd.env[warm_restart.RESTART_FILE_VAR] = str(run.job_dir / "restart.json")
        return Prepared(cmd.argv, cmd.env, cmd.files,
                        container=container_of(run.spec, run.ctx.job_name), run_id=run.run_id)

    def lost_nodes(self, job_dir: Path) -> set[str]:
        return set()  # this host is the one node: if it went, so did we

    def adopt_orphans(self) -> None:
        keeper.become_subreaper()  # a keeper killed with its supervisor alive orphans torchrun

    def end_orphans(self) -> None:
        """Kill anything still below us (workers re-parented to us as subreaper).

        A supervisor owns its process: it runs as the `gpufleet run` command or as a detached
        `python -m gpufleet.supervise.supervisor`, never inside a program with other children.
        """
        try:
            left = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        kill(left)

    def node_lost(self, code: int, lines: list[str]) -> str | None:
        return None  # one node: no node of ours goes without us

    def report_host(self) -> str:
        return ADDRESS

    def start(self, prepared: base.Prepared, env: dict[str, str], cwd: Path) -> Handle:
        if prepared.container is None:
            return self.spawn(prepared.argv, env, cwd)
        return self.start_in_image(prepared.container, prepared.argv, env, cwd, prepared.run_id)

    def start_in_image(self, c: Container, argv: list[str], env: dict[str, str], cwd: Path,
                       run_id: str) -> Handle:
        """The launcher inside `c.image`, after the image passed its checks here (an
        `ImageError` before anything starts; a restart reuses what the first start found).
        The keeper holds the runtime's client as it holds a bare launcher, and removes the
        container by name once the client ended, however it ended (a killed `podman run`
        does not stop its container)."""
        got = in_image(c.to_json(), run_id, NODE_ID, argv, env, str(cwd), sides=self.sides)
        proc, lifeline = keeper.spawn(got.argv, {**env, **got.env}, cwd, after=got.after,
                                      say=got.say)
        return Handle(proc, lifeline)

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path) -> Handle:
        """Start `argv` (never through a shell) under a keeper in a new session, merging
        stderr into stdout. If we die, however we die, the keeper ends the whole tree
        (backends/keeper.py says why not a parent-death signal on torchrun itself), so a
        killed supervisor does not leave a job running on devices the store has freed."""
        proc, lifeline = keeper.spawn(argv, env, cwd)
        return Handle(proc, lifeline)

    def poll(self, handle: base.Handle) -> int | None:
        return handle.poll()

    def signal(self, handle: base.Handle, sig: int) -> None:
        """Signal the whole tree: torchrun starts each worker in a session of its own, so a
        process-group signal would miss them; we walk the descendants instead."""
        send_signal(tree(handle.pid), sig)

    def run_to_end(self, argv: list[str], env: dict[str, str], cwd: Path,
                   timeout_s: float) -> tuple[str, int | None]:
        """Run `argv` to its end and return (output, exit code); None as the code when it ran past
        `timeout_s`. On a timeout or an interrupt (Ctrl-C) the whole tree is killed first, so a
        one-off measurement never leaves workers behind."""
        handle = self.spawn(argv, env, cwd)
        timed_out = False
        try:
            out, _ = handle.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill_tree(handle, grace_s=5.0)
            out, _ = handle.proc.communicate()
        except BaseException:
            self.kill_tree(handle, grace_s=5.0)
            raise
        return (out or b"").decode(errors="replace"), None if timed_out else handle.poll()

    def kill_tree(self, handle: base.Handle, grace_s: float = 10.0) -> None:
        """SIGTERM the tree below the keeper, SIGKILL whatever is still alive after `grace_s`
        seconds, and let the keeper end by itself: its clean-up (a container's removal) runs
        after the launcher ended, and must not be killed with it (backends/proc_tree.py)."""
        end_kept(handle.pid, handle.wait, grace_s)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (an empty host: any address of this machine), for a
    launcher or server that must be told its port before it starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
