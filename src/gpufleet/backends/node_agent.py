"""The agent on each node of a multi-node run: the node's torchrun under a keeper, its lines
kept for the driver, its devices sampled for the supervisor, and the supervisor's decision for
a launcher that waits (node_restart.py) written where that launcher reads it.

The same agent runs in a Ray actor on a Ray node, inside an `srun` step on a Slurm node and
under `ssh_node run` on an SSH host; the drivers (node_driver.NodeDriver and the engines')
talk to it through these methods only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.backends import files_back, keeper, node_net
from gpufleet.backends.node_image import in_image
from gpufleet.backends.node_restart import parse_order
from gpufleet.bootstrap import SITE_DIR
from gpufleet.launch import warm_restart
from gpufleet.launch.container import NodeSide
from gpufleet.launch.warm_restart import RESTART_FILE_VAR, parked_code
from gpufleet.reportauth import Signer, signer_from_env
from gpufleet.telemetry import wire


class NodeAgent:
    """Runs one node's torchrun inside a Ray actor on that node. Methods run one at a time."""

    def __init__(self, node: str, report_addr: str):
        """`node`: the pool's node id, which labels the device samples as the ranks' reports."""
        self.node, self.report_addr = node, report_addr
        self.proc: subprocess.Popen[bytes] | None = None
        self.lifeline: int | None = None  # the write end of the keeper's lifeline, held for good
        self.lines: deque[str] = deque(maxlen=100_000)
        self.reader: threading.Thread | None = None
        self.stopping = threading.Event()
        self.signer: Signer | None = None
        self.back_from: Path | None = None  # the job folder this node does not see
        self.started_at = 0.0
        self.sides: dict[str, NodeSide] = {}  # an image's node facts, found at its first start
        self.restart_file: Path | None = None  # where its launcher waits for a decision

    def ready(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def start(self, argv: list[str], env: dict[str, str], cwd: str,
              sampling: dict[str, Any], files_back: str | None = None,
              container: dict[str, Any] | None = None, run: str = "") -> int:
        """Start the node's torchrun. `files_back`: the submitter's job folder, given only for a
        node that does not see it (the plan entry's `files_back`, launch/travel.py): what
        torchrun writes under it is on this node's disk alone, so `drain` sends it back once
        torchrun has ended. A node that sees the folder must not get it: the driver would
        write each file onto itself. `container`: the plan's image (backends/node_image.py):
        checked here first (`ImageError` before anything starts), the launcher then inside it."""
        if argv and argv[0] == "{python}":
            argv = [sys.executable, *argv[1:]]  # this node's interpreter, not the driver's
        self.signer = signer_from_env(env)
        if env.get("PYTHONPATH"):
            env = {**env, "PYTHONPATH": own_site(env["PYTHONPATH"], str(SITE_DIR), os.path.isdir)}
        self.back_from = Path(files_back) if files_back else None
        self.started_at = time.time() - 1.0  # mtimes are whole seconds on some file systems
        # the workers' interface, and a head that cannot be reached said now (node_net.py):
        # RendezvousUnreachableError before any worker starts
        env = {**env, **node_net.prepare(self.node, env, os.environ)}
        if RESTART_FILE_VAR in env:  # restarts in place (node_restart.py): a file of this node's
            self.restart_file = restart_file_of(env, self.node, in_image=container is not None)
            if self.restart_file is None:  # none the launcher could read: it ends on a failure
                env = {k: v for k, v in env.items() if k != RESTART_FILE_VAR}
            else:
                self.restart_file.unlink(missing_ok=True)  # an earlier run's decision is not ours
                env[RESTART_FILE_VAR] = str(self.restart_file)
        after: list[str] | None = None
        say: str | None = None
        if container is not None:
            got = in_image(container, run, self.node, argv, env, cwd, sides=self.sides)
            argv, env, after, say = got.argv, {**env, **got.env}, got.after, got.say
        # the lifeline's write end stays open in this actor process for as long as it lives
        self.proc, self.lifeline = keeper.spawn(argv, {**os.environ, **env}, cwd, after=after,
                                                say=say)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        threading.Thread(target=self._sample, args=(sampling,), daemon=True).start()
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def drain(self) -> tuple[list[str], int | None]:
        """Lines since the last call, and the exit code once torchrun ended and its output
        was read to the end; with that code, after the last line, the files to send back
        (files_back.framed: this run's files under the job folder's `torchrun/`), once."""
        code = self.proc.poll() if self.proc is not None else None
        if code is not None and self.reader is not None:
            self.reader.join(timeout=2)
        out = []
        while self.lines:
            line = self.lines.popleft()
            if self.back_from is not None and parked_code(line) is not None:
                # the failed run's error records first: the supervisor reads them at this line
                out.extend(files_back.framed(self.back_from, since=self.started_at))
            out.append(line)
        if code is not None and self.restart_file is not None:
            let_go(self.restart_file)
            self.restart_file = None
        if code is not None and self.back_from is not None:
            out.extend(files_back.framed(self.back_from, since=self.started_at))
            self.back_from = None
        return out, code

    def decide(self, line: str) -> bool:
        """The supervisor's decision for a launcher that waits (an order line of
        node_restart.py), written where the launcher reads it; False when this node's launcher
        takes none or the line is not an order."""
        got = parse_order(line)
        if got is None or self.restart_file is None:
            return False
        decision = got[0]
        if decision.end is not None:
            warm_restart.write_end(self.restart_file, decision.end)
        else:
            warm_restart.write(self.restart_file, decision.run, decision.env)
        return True

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM torchrun and its workers (each in a session of its own), SIGKILL what is
        left after `grace_s`, and let the keeper end by itself once it removed the run's
        container (backends/proc_tree.py: killed with the rest, it left the container)."""
        from gpufleet.backends.proc_tree import end_kept

        self.stopping.set()
        if self.proc is None:
            return None
        proc = self.proc

        def wait(timeout: float) -> int | None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.wait(timeout=timeout)
            return None

        return end_kept(proc.pid, wait, grace_s)

    def _sample(self, sampling: dict[str, Any]) -> None:
        """Device samples once a second to the supervisor, keyed by the device's position in
        the cluster. Telemetry must never take the node down: any error ends sampling only."""
        from gpufleet.telemetry.collect import CpuSampler, NvmlSampler

        host, _, port = self.report_addr.rpartition(":")
        ids: list[str] = sampling["devices"]
        base: int = sampling["key_base"]
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            cpu = nvml = None
            if sampling["on_cpu"]:
                cpu = CpuSampler(ids, sampling["threads"], sampling["memory_per_slot"],
                                 rank_var="LOCAL_RANK")
            else:
                nvml = NvmlSampler(sampling["indices"], ids)
            while not self.stopping.wait(1.0 - time.time() % 1.0):
                if self.proc is None or self.proc.poll() is not None:
                    break
                if cpu is not None:
                    cpu.find(self.proc.pid)
                found = cpu.sample() if cpu is not None else nvml.sample() if nvml else []
                if found and self.signer is not None:
                    rec = wire.device_samples_record(
                        self.node, time.time(), [(base + s.key, s.device, s.name, s.value) for s in found])
                    with contextlib.suppress(OSError):
                        sock.sendto(self.signer.seal(json.dumps(rec).encode()),
                                    (host, int(port)))
        except Exception:  # see the docstring
            return


OWN_DIR = "gpufleet-restart-"  # a folder of the agent's own, when the job folder cannot be made


def restart_file_of(env: dict[str, str], node: str, in_image: bool = False) -> Path | None:
    """Where node `node`'s launcher waits for a decision: in the job folder as this node has it
    (named by the node, as nodes may share the folder; made where the node does not see the
    submitter's, as torchrun makes its log folder there; an image mounts it), else in a
    temporary folder of its own (`let_go` removes it). None for a launcher `in_image` when the
    job folder cannot be made: the container mounts no other folder of the node's, and a
    launcher waiting on a file it cannot see would wait until the hang timeout; without one it
    ends on a failure as plain torchrun does, and the run starts new launchers."""
    name = f"restart-{re.sub(r'[^A-Za-z0-9_.-]', '_', node)}.json"
    job_dir = env.get("GPUFLEET_JOB_DIR", "")
    if job_dir:
        try:
            Path(job_dir).mkdir(parents=True, exist_ok=True)
            return Path(job_dir) / name
        except OSError:
            pass
    return None if in_image else Path(tempfile.mkdtemp(prefix=OWN_DIR)) / name


def let_go(path: Path) -> None:
    """The restart file gone, and its folder when it was the agent's own."""
    path.unlink(missing_ok=True)
    if path.parent.name.startswith(OWN_DIR):
        shutil.rmtree(path.parent, ignore_errors=True)


def own_site(pythonpath: str, site: str, exists: Callable[[str], bool]) -> str:
    """`pythonpath` with the submitter's gpufleet bootstrap folder (`.../gpufleet/bootstrap/site`,
    first on every worker's path) made this node's `site` where the node does not have the
    submitter's: a node that does not see the submitter's files has its own gpufleet, and
    without the bootstrap its workers would write no error record (bootstrap/errorfile.py)."""
    return ":".join(site if p.endswith("/gpufleet/bootstrap/site") and not exists(p) else p
                    for p in pythonpath.split(":"))
