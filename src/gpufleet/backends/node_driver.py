"""What a multi-node run's driver does whatever the engine: the per-node agent, the node
tags on every line, and the watch over the nodes (fail fast, lost nodes, stop on SIGTERM).

A driver (`python -m gpufleet.backends.ray_run PLAN.json`, `... slurm_run PLAN.json`) is what
the supervisor starts in place of torchrun for a cluster of several nodes. Each engine says
only how a node's workers are started and looked at (a Ray actor pinned to the node, an `srun`
step in the allocation); `NodeDriver` does the rest the same way for all of them:

- every line is printed as `[NODE rankN]:` (the node's name in the cluster: head, worker1,
  ...), so the supervisor's logs carry (node, rank);
- it fails fast: the first node to fail, or to be lost, ends every other node at once, and
  the driver exits naming it, NODE_LOST_EXIT after a `NodeLostError:` line for a lost node
  (its id also written beside the plan, so the heal replaces it even before the engine has
  marked it dead); no node waits on a dead peer;
- it exits 0 when every node's torchrun did;
- on SIGTERM (`stop_asked`) it ends every node and exits 143.

On each node, `NodeAgent` runs the node's torchrun under a keeper (backends/keeper.py: the
node's whole tree ends when the agent does) and samples the node's devices once a second for
the supervisor, signed with the job's key.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gpufleet.backends import files_back, keeper, node_net
from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.backends.node_image import in_image
from gpufleet.bootstrap import SITE_DIR
from gpufleet.launch.container import NodeSide
from gpufleet.reportauth import Signer, signer_from_env
from gpufleet.telemetry import wire

POLL_S = 0.2
# After a node's own failure, how long the other nodes get to end by themselves before they are
# signalled: their torchrun prints the summary naming its own failed ranks only once it noticed
# them, and SIGTERM before that (a busy machine, a second or two) leaves no summary at all, so
# the job's failure was blamed on the victim that ended first. A peer's death reaches every
# rank within moments (a closed connection), so the wait ends long before this as a rule.
PEERS_END_S = 5.0
STOPPED_EXIT = 143  # the driver's exit after a stop: as a process ended by SIGTERM


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
            out.append(self.lines.popleft())
        if code is not None and self.back_from is not None:
            out.extend(files_back.framed(self.back_from, since=self.started_at))
            self.back_from = None
        return out, code

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


def own_site(pythonpath: str, site: str, exists: Callable[[str], bool]) -> str:
    """`pythonpath` with the submitter's gpufleet bootstrap folder (`.../gpufleet/bootstrap/site`,
    first on every worker's path) made this node's `site` where the node does not have the
    submitter's: a node that does not see the submitter's files has its own gpufleet, and
    without the bootstrap its workers would write no error record (bootstrap/errorfile.py)."""
    return ":".join(site if p.endswith("/gpufleet/bootstrap/site") and not exists(p) else p
                    for p in pythonpath.split(":"))


def pump(i: int, out: IO[bytes] | None, into: queue.Queue[tuple[int, str]]) -> None:
    """A reader thread's loop: node `i`'s output lines, as they come, into the driver's queue
    (drivers that follow each node through a local process: an srun step, an ssh session)."""
    assert out is not None
    for raw in iter(out.readline, b""):
        into.put((i, raw.decode("utf-8", "replace").rstrip("\n")))


def tag(node: str, line: str) -> str:
    """torchrun's `[rankN]:` becomes `[NODE rankN]:`; the agent's own lines `[NODE]: ...`."""
    if _RANK_PREFIX.match(line):
        return f"[{node} {line[1:]}"
    return f"[{node}]: {line}"


_RANK_PREFIX = re.compile(r"^\[rank\d+\]:")


class NodeDriver:
    """The watch over a run's nodes. An engine's driver fills in `place`, `poll`,
    `confirm_lost`, `lost_text` and `end_all`; `run` and the decisions are here."""

    def __init__(self, plan: dict[str, Any], lost_path: Path | None):
        self.plan, self.lost_path = plan, lost_path
        self.nodes: list[dict[str, Any]] = plan["nodes"]
        self.stop_asked = False

    # -- what each engine says ------------------------------------------------------------------
    def place(self) -> int | None:
        """Start every node's workers; an exit code when that failed (after ending them)."""
        raise NotImplementedError

    def poll(self) -> tuple[dict[int, int], set[str]]:
        """Print the lines since the last call (`tag`ged); the exit codes of the nodes whose
        workers ended (by index, all so far) and the ids of nodes known lost now."""
        raise NotImplementedError

    def confirm_lost(self) -> tuple[set[str], str]:
        """After a node failed (or one looks lost): the ids of lost nodes, and how that is
        known (set(): none was lost; the failure is the node's own)."""
        raise NotImplementedError

    def suspect(self) -> bool:
        """Whether the engine already hints at a lost node before any node failed."""
        return False

    def lost_text(self, lost: set[str], how: str) -> str:
        raise NotImplementedError

    def end_all(self, grace_s: float) -> None:
        """End every node's workers: SIGTERM, and what is left after `grace_s` killed."""
        raise NotImplementedError

    # -- the same for every engine --------------------------------------------------------------
    def let_peers_end(self, ended: int) -> None:
        """Poll (printing what the nodes say) until every node ended by itself or PEERS_END_S
        passed; a node lost meanwhile is left to `end_all`, the job fails either way."""
        deadline = time.monotonic() + PEERS_END_S
        while ended < len(self.nodes) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            done, lost = self.poll()
            if lost:
                return
            ended = len(done)

    def catch_stop(self) -> None:
        """SIGTERM and SIGINT ask the watch to stop (it ends every node, then exits 143). Ray's
        driver calls it again after connecting: `ray.init` installs a handler of its own."""
        def on_signal(_sig: int, _frame: object) -> None:
            self.stop_asked = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def say(self, text: str) -> None:
        sys.stdout.write(f"gpufleet: {text}\n")
        sys.stdout.flush()

    def lost(self, text: str, node_ids: set[str]) -> None:
        """A line the supervisor reads as the run's error (a Python-style 'XError: ...'), and
        the lost nodes in a file beside the plan."""
        sys.stdout.write(f"NodeLostError: {text}\n")
        sys.stdout.flush()
        if self.lost_path is not None:
            with contextlib.suppress(OSError):
                self.lost_path.write_text(json.dumps(sorted(node_ids)))

    def named(self, lost: set[str]) -> str:
        """The lost nodes as `name (id)`, in the cluster's order (ids the plan lacks as given)."""
        return ", ".join(f"{n['name']} ({n['node_id']})" for n in self.nodes
                         if n["node_id"] in lost) or ", ".join(sorted(lost))

    def run(self) -> int:
        code = self.place()
        return code if code is not None else self.watch()

    def watch(self) -> int:
        while True:
            if self.stop_asked:
                self.say("stop asked: ending torchrun on every node")
                self.end_all(grace_s=10.0)
                return STOPPED_EXIT
            ended, lost = self.poll()
            failed = next(((i, c) for i, c in sorted(ended.items()) if c != 0), None)
            how = ""
            if not lost and (failed is not None or self.suspect()):
                # a peer's death shows first as a connection error on the survivors: look for a
                # lost node before blaming the one that failed
                lost, how = self.confirm_lost()
            if lost:
                self.lost(self.lost_text(lost, how), lost)
                self.end_all(grace_s=5.0)
                return NODE_LOST_EXIT
            if failed is not None:
                i, code = failed
                self.say(f"node {self.nodes[i]['name']} exited with code {code}; ending the "
                         "other nodes")
                self.let_peers_end(len(ended))
                self.end_all(grace_s=10.0)
                return code
            if len(ended) == len(self.nodes):
                return 0
            time.sleep(POLL_S)
