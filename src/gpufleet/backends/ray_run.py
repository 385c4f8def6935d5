"""One run of a multi-node job on a Ray pool: a local driver and one `NodeAgent` actor per node.

`python -m gpufleet.backends.ray_run PLAN.json` is what the supervisor starts in place of
torchrun. It connects to Ray, starts an agent pinned to each of the cluster's nodes (node
affinity, not soft, holding the node's devices in Ray's own accounting so nothing else Ray runs
takes them), and each agent runs that node's torchrun. The driver:

- prints every line as `[NODE rankN]:` (the node's name in the cluster: head, worker1, ...),
  so the supervisor's logs carry (node, rank);
- fails fast: the first node to fail, or to vanish (its raylet or machine died), ends every other
  node at once, and the driver exits non-zero naming it; no node waits on a dead peer;
- exits 0 when every node's torchrun did;
- on SIGTERM ends every node (SIGTERM, then SIGKILL after a grace period).

Actors belong to this driver: if the driver dies, however it dies, Ray ends them, and each agent
runs its torchrun under a keeper (backends/keeper.py) that ends the node's whole tree when its
agent dies, so no worker outlives the job. (A parent-death signal on torchrun itself would fire
once per thread of the dying actor process, and a few SIGTERMs in a row can hang torchrun.)
The agents also sample their node's devices once a second and send the samples to the
supervisor's report address, as workers send their reports, signed with the job's key: the
driver has it in its environment ($GPUFLEET_REPORT_KEY) and hands it to each agent with the
node's environment, never in the plan file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from gpufleet.backends import keeper
from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.reportauth import KEY_ENV, Signer, signer_from_env
from gpufleet.telemetry import wire

PLACE_FAILED_EXIT = 70
READY_TIMEOUT_S = 60.0
POLL_S = 0.2


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

    def ready(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def start(self, argv: list[str], env: dict[str, str], cwd: str,
              sampling: dict[str, Any]) -> int:
        if argv and argv[0] == "{python}":
            argv = [sys.executable, *argv[1:]]  # this node's interpreter, not the driver's
        self.signer = signer_from_env(env)
        # the lifeline's write end stays open in this actor process for as long as it lives
        self.proc, self.lifeline = keeper.spawn(argv, {**os.environ, **env}, cwd)
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
        was read to the end."""
        code = self.proc.poll() if self.proc is not None else None
        if code is not None and self.reader is not None:
            self.reader.join(timeout=2)
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out, code

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM torchrun and its workers (each in a session of its own), SIGKILL what is
        left after `grace_s`."""
        import psutil

        from gpufleet.backends.local import terminate

        self.stopping.set()
        if self.proc is None:
            return None
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        terminate(procs, grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return self.proc.poll()

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


def tag(node: str, line: str) -> str:
    """torchrun's `[rankN]:` becomes `[NODE rankN]:`; the agent's own lines `[NODE]: ...`."""
    if _RANK_PREFIX.match(line):
        return f"[{node} {line[1:]}"
    return f"[{node}]: {line}"


_RANK_PREFIX = re.compile(r"^\[rank\d+\]:")


class Driver:
    def __init__(self, plan: dict[str, Any], lost_path: Path | None = None):
        self.plan = plan
        self.lost_path = lost_path
        self.nodes: list[dict[str, Any]] = plan["nodes"]
        self.agents: list[Any] = []
        self.stop_asked = False

    def say(self, text: str) -> None:
        sys.stdout.write(f"gpufleet: {text}\n")
        sys.stdout.flush()

    def lost(self, text: str, nodes: list[dict[str, Any]]) -> None:
        """A line the supervisor reads as the run's error (a Python-style 'XError: ...'), and
        the lost nodes in a file beside the plan, so the next run replaces them even before
        Ray's own failure detector has marked them dead."""
        sys.stdout.write(f"NodeLostError: {text}\n")
        sys.stdout.flush()
        if self.lost_path is not None:
            with contextlib.suppress(OSError):
                self.lost_path.write_text(json.dumps([n["node_id"] for n in nodes]))

    def run(self) -> int:
        from gpufleet.backends import ray_run  # by module name even when run as __main__
        from gpufleet.backends.ray import connect
        from gpufleet.backends.ray_auth import env_token_path

        ray = connect(self.plan["address"], env_token_path(os.environ))
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(ray_run.NodeAgent)
        for n in self.nodes:
            custom = dict(n["resources"])
            gpus = custom.pop("GPU", 0)  # Ray's own GPUs are asked for by num_gpus
            self.agents.append(remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["ray_id"], soft=False),
                num_cpus=0, num_gpus=gpus, resources=custom, max_restarts=0, max_concurrency=1,
            ).remote(n["node_id"], self.plan["report_addr"]))
        code = self._place(ray)
        if code is not None:
            return code
        key = {KEY_ENV: os.environ[KEY_ENV]} if KEY_ENV in os.environ else {}
        starts = [a.start.remote(n["argv"], {**n["env"], **key}, n["cwd"], n["sampling"])
                  for a, n in zip(self.agents, self.nodes, strict=True)]
        try:
            ray.get(starts, timeout=READY_TIMEOUT_S)
        except Exception as exc:  # an agent that cannot start is a node failure
            self.say(f"could not start torchrun on every node: {type(exc).__name__}: {exc}")
            self._end_all(ray, grace_s=5.0)
            return PLACE_FAILED_EXIT
        self.say(f"torchrun started on {len(self.nodes)} node(s): "
                 + ", ".join(f"{n['name']} ({n['address']})" for n in self.nodes))
        return self._watch(ray)

    def _place(self, ray: Any) -> int | None:
        """Wait for every agent to be placed; an agent Ray cannot place (its node is gone, or
        its devices are held by something outside gpufleet) fails the run with the reason
        instead of waiting for ever."""
        refs = [a.ready.remote() for a in self.agents]
        deadline = time.monotonic() + float(self.plan.get("ready_timeout_s", READY_TIMEOUT_S))
        pending = list(refs)
        while pending and time.monotonic() < deadline and not self.stop_asked:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
        failed: list[str] = []
        gone: list[dict[str, Any]] = []
        for ref, n in zip(refs, self.nodes, strict=True):
            if ref in pending:
                gone.append(n)
                failed.append(f"{n['name']} ({n['address']}): not placed within "
                              f"{self.plan.get('ready_timeout_s', READY_TIMEOUT_S):.0f} s; the node "
                              f"is gone or Ray holds its {n['resources'] or 'devices'} for other work")
                continue
            try:
                ray.get(ref, timeout=5)
            except Exception as exc:
                gone.append(n)
                failed.append(f"{n['name']} ({n['address']}): {type(exc).__name__}")
        if self.stop_asked:
            self._end_all(ray, grace_s=0.0)
            return 143
        if failed:
            self.lost("cannot place the job's agent on " + "; ".join(failed), gone)
            self._end_all(ray, grace_s=0.0)
            return NODE_LOST_EXIT if any("gone" in f or "Died" in f for f in failed) \
                else PLACE_FAILED_EXIT
        return None

    def _watch(self, ray: Any) -> int:
        done: dict[int, int] = {}
        while True:
            if self.stop_asked:
                self.say("stop asked: ending torchrun on every node")
                self._end_all(ray, grace_s=10.0)
                return 143
            lost, failed = self._poll(ray, done)
            if lost is not None:
                n = self.nodes[lost]
                self.lost(f"node {n['name']} ({n['address']}) left the Ray cluster mid-job (its "
                          "raylet or machine died); ending the other nodes", [n])
                self._end_all(ray, grace_s=5.0)
                return NODE_LOST_EXIT
            if failed is not None:
                i, code = failed
                # a peer's death shows first as a connection error here: look once more for a
                # lost node before blaming this one
                time.sleep(1.0)
                lost, _ = self._poll(ray, done)
                if lost is not None:
                    continue
                self.say(f"node {self.nodes[i]['name']} exited with code {code}; ending the "
                         "other nodes")
                self._end_all(ray, grace_s=10.0)
                return code
            if len(done) == len(self.nodes):
                return 0
            time.sleep(POLL_S)

    def _poll(self, ray: Any, done: dict[int, int]) -> tuple[int | None, tuple[int, int] | None]:
        """Drain every live agent; (a lost node's index, (a failed node's index, its code))."""
        live = [i for i in range(len(self.nodes)) if i not in done]
        refs = {i: self.agents[i].drain.remote() for i in live}
        failed: tuple[int, int] | None = None
        for i, ref in refs.items():
            try:
                lines, code = ray.get(ref, timeout=30)
            except Exception:  # ActorDiedError, unavailable, timeout: the node
                return i, None
            name = self.nodes[i]["name"]
            for line in lines:
                sys.stdout.write(tag(name, line) + "\n")
            sys.stdout.flush()
            if code is not None:
                done[i] = code
                if code != 0 and failed is None:
                    failed = (i, code)
        return None, failed

    def _end_all(self, ray: Any, grace_s: float) -> None:
        refs = []
        for a in self.agents:
            with contextlib.suppress(Exception):
                refs.append(a.stop.remote(grace_s))
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=grace_s + 15)
        for a in self.agents:
            with contextlib.suppress(Exception):
                ray.kill(a)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0])
    plan = json.loads(path.read_text())
    # Ray's own chatter (raylet state dumps, warnings) goes to a file, not the job's log
    with open(path.with_name("ray-driver.log"), "ab") as noise:
        os.dup2(noise.fileno(), 2)
    driver = Driver(plan, path.with_suffix(".lost"))

    def on_signal(_sig: int, _frame: object) -> None:
        driver.stop_asked = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return driver.run()


if __name__ == "__main__":
    sys.exit(main())
