"""One run of a job on a Slurm cluster: a local driver and one `srun` step per node.

`python -m gpufleet.backends.slurm_run PLAN.json` is what the supervisor starts in place of
torchrun. For each node of the cluster's allocation it starts `srun --jobid J --nodelist NODE
--overlap ... python -m gpufleet.backends.slurm_run --node I PLAN.json`; on the node that step
runs the node's torchrun under a keeper (`node_agent.NodeAgent`, the same agent a Ray pool
uses: it ends the node's whole tree when the step ends, and samples the node's devices for the
supervisor, signed with the job's key). The step runs the pool's node interpreter (`pool add
slurm --python`; else this machine's path, for nodes that share its files); where a node does
not see the job folder, the plan and the workdir reach it by `sbcast` (slurm_travel).

The watch over the nodes is `node_driver.NodeDriver`'s, as for Ray (every line tagged with its
node, fail fast, exit 0 when every node's torchrun did). A node is lost when srun says `Node
failure on NODE`, Slurm marks it down, or its step does not answer; ending the nodes is
SIGTERM through srun, then `scancel` of what is left. After the run, however it ended, one
clean-up step removes a shipped workdir from the nodes (slurm_clean: a killed step never ran
its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from gpufleet.backends import (
    files_back,
    node_workdir,
    slurm_clean,
    slurm_spares,
    slurm_travel,
    workdir_ship,
)
from gpufleet.backends import slurm_cmds as cmds
from gpufleet.backends import slurm_parse as parse
from gpufleet.backends.node_agent import NodeAgent
from gpufleet.backends.node_driver import NodeDriver, pump, tag
from gpufleet.backends.node_image import IMAGE_FAILED_EXIT
from gpufleet.backends.node_net import RendezvousUnreachableError
from gpufleet.errors import ImageError
from gpufleet.reportauth import KEY_ENV

PLACE_FAILED_EXIT = 70  # the workdir could not be shipped (as ray_run's agents not placed)

POLL_S = 0.2  # how often a step's end is looked for while nodes are asked to end
ANSWER_S = 10.0  # how long a step has to end when asked before its node counts as not answering
CONFIRM_S = 15.0  # how long Slurm is then given to mark that node down
_NO_ANSWER = "Timed out waiting for job step"  # srun, when the node's slurmd does not answer
_NODE_FAILURE = re.compile(r"Node failure on (\S+)")


def lost_named(lines: Iterable[str]) -> set[str]:
    """The nodes srun said failed (`srun: error: Node failure on n2`)."""
    return {m.group(1).rstrip(".,") for ln in lines for m in _NODE_FAILURE.finditer(ln)}


def node_argv(index: int, plan_path: Path, python: str | None = None) -> list[str]:
    """What the step on node `index` runs: the pool's node interpreter (`pool add slurm
    --python`), else this machine's own path (the nodes share its file system)."""
    return [python or sys.executable, "-m", "gpufleet.backends.slurm_run", "--node", str(index),
            str(plan_path)]


class Driver(NodeDriver):
    """A run's nodes as `srun` steps inside the cluster's Slurm allocation."""

    def __init__(self, plan: dict[str, Any], plan_path: Path):
        super().__init__(plan, plan_path.with_suffix(".lost"))
        self.plan_path = plan_path
        self.job_id: str = plan["job_id"]
        self.env = dict(os.environ)
        if plan.get("slurm_conf"):
            self.env["SLURM_CONF"] = plan["slurm_conf"]
        # srun carries this environment to the nodes: a node's cache is the node's to choose
        self.env.pop(node_workdir.CACHE_ENV, None)
        self.steps: list[subprocess.Popen[bytes]] = []
        self.readers: list[threading.Thread] = []
        self.lines: queue.Queue[tuple[int, str]] = queue.Queue()
        self.said: list[tuple[int, str]] = []  # srun's own lines by node, read for failures
        self.how = ""
        self.node_plans = {i: plan_path for i in range(len(self.nodes))}
        self.lost_ids: set[str] = set()
        self.warming: slurm_spares.Warming | None = None
        self.final = bool(plan.get("final"))  # the job's last run (or restart in place)

    def run(self) -> int:
        """The run, then the clean-up step over the nodes that got a shipped copy (however
        the run ended: its steps may have been killed before their own clean-up); once the
        job is done, the job's mark off the nodes and the spares (slurm_spares)."""
        code: int | None = None
        try:
            code = super().run()
            return code
        finally:
            if self.warming is not None:
                self.warming.stop()
            slurm_clean.clean(self.plan, self.node_plans, self.lost_ids, self.env, self.say)
            if code == 0 or self.stop_asked or self.final or self.over:
                slurm_spares.release(self.plan, self.lost_ids, self.env, self.say)

    def next_is_final(self) -> bool:
        """The plan the supervisor wrote for the run it asked for says whether it is the
        job's last: the spares' marks go after it."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            self.final = bool(json.loads(self.plan_path.read_text())["final"])
        return self.final

    def lost(self, text: str, node_ids: set[str]) -> None:
        self.lost_ids |= node_ids  # no clean-up step for them: their slurmd does not answer
        super().lost(text, node_ids)

    def _travel(self) -> int | None:
        """The workdir before any torchrun (slurm_travel.ship); an exit code if it failed."""
        shipped = slurm_travel.ship(self.plan, self.plan_path, self.job_id, self.env, self.say,
                                     _print)
        if shipped is None:
            return PLACE_FAILED_EXIT
        self.plan, self.node_plans = shipped
        return None

    def place(self) -> int | None:
        code = self._travel()
        if code is not None:
            return code
        unseen = (self.plan.get("travel") or {}).get("unseen", [])
        for i, n in enumerate(self.nodes):
            argv = cmds.srun(self.job_id, n["node_id"],
                             node_argv(i, self.node_plans[i], self.plan.get("node_python")),
                             chdir="/" if i in unseen else None)
            # stdin: srun carries the driver's orders to the step (node_restart.py)
            step = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.PIPE, env=self.env,
                                    start_new_session=True)
            self.steps.append(step)
            reader = threading.Thread(target=pump, args=(i, step.stdout, self.lines), daemon=True)
            reader.start()
            self.readers.append(reader)
        self.say(f"torchrun starting on {len(self.nodes)} node(s) of Slurm job {self.job_id}: "
                 + ", ".join(f"{n['name']} ({n['node_id']})" for n in self.nodes))
        warm = slurm_spares.warm_argv(self.plan, self.plan_path,
                                      self.plan.get("node_python") or sys.executable)
        if warm is not None:
            self.warming = slurm_spares.Warming(warm, self.env, self.say,
                                                slurm_spares.spare_ids(self.plan))
            self.warming.start()
        return None

    def _drain(self) -> None:
        while True:
            try:
                i, text = self.lines.get_nowait()
            except queue.Empty:
                return
            if files_back.write_back(self.plan_path.parent, text):
                continue  # a file an unseen node sent back (files_back.py), not a log line
            if text.startswith(("srun:", "slurmstepd:")):
                self.said.append((i, text))
            sys.stdout.write(tag(self.nodes[i]["name"], self.parks.saw(i, text)) + "\n")
        sys.stdout.flush()

    def relay(self, line: str) -> None:
        """An order (node_restart.py) on every step's stdin, which srun forwards to its task."""
        for s in self.steps:
            if s.poll() is None and s.stdin is not None:
                with contextlib.suppress(OSError, ValueError):
                    s.stdin.write((line + "\n").encode())
                    s.stdin.flush()

    def poll(self) -> tuple[dict[int, int], set[str]]:
        codes = {i: c for i, s in enumerate(self.steps) if (c := s.poll()) is not None}
        for i in codes:
            if self.readers[i].is_alive():  # every line and file its step sent, first
                self.readers[i].join(timeout=5)
        self._drain()
        return codes, set()

    def suspect(self) -> bool:
        return bool(lost_named(text for _, text in self.said))

    def confirm_lost(self) -> tuple[set[str], str]:
        return self._find_lost()

    def lost_text(self, lost: set[str], how: str) -> str:
        return (f"node {self.named(lost)} of Slurm job {self.job_id} was lost mid-job ({how}); "
                "ending the other nodes")

    def _find_lost(self) -> tuple[set[str], str]:
        """After a step failed: was a node lost? A peer's death shows first as a connection
        error on the survivors, and Slurm marks a dead node only after its SlurmdTimeout. So:
        srun's `Node failure on NODE`, or Slurm showing the node down; else the live steps
        are asked to end, and a node whose step does not answer (its slurmd is gone) is lost,
        confirmed by Slurm if it says so within CONFIRM_S."""
        time.sleep(1.0)
        self._drain()
        named = lost_named(text for _, text in self.said)
        if named:
            return named, "Slurm: node failure"
        down = self._down()
        if down:
            return down, "Slurm marks it down"
        live = [i for i, s in enumerate(self.steps) if s.poll() is None]
        for i in live:
            with contextlib.suppress(OSError):
                self.steps[i].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + ANSWER_S
        while time.monotonic() < deadline and any(self.steps[i].poll() is None for i in live):
            self._drain()
            time.sleep(POLL_S)
        self._drain()
        hung = {self.nodes[i]["node_id"] for i in live if self.steps[i].poll() is None}
        hung |= {self.nodes[i]["node_id"] for i, text in self.said if _NO_ANSWER in text}
        if not hung:
            return set(), ""
        deadline = time.monotonic() + CONFIRM_S
        while time.monotonic() < deadline:
            down = self._down() & hung
            if down:
                return down, "its slurmd stopped answering; Slurm marks it down"
            time.sleep(1.0)
        return hung, "its slurmd stopped answering; Slurm has not marked it down yet"

    def _down(self) -> set[str]:
        """The run's nodes that Slurm shows lost now (not responding, down, drained)."""
        try:
            done = subprocess.run(cmds.show_nodes(), capture_output=True, text=True, timeout=15,
                                  env=self.env)
        except (OSError, subprocess.TimeoutExpired):
            return set()
        mine = {n["node_id"] for n in self.nodes}
        return {n.node.id for n in parse.nodes_of(done.stdout, None)
                if n.node.id in mine and not n.node.healthy}

    def end_all(self, grace_s: float) -> None:
        """SIGTERM through srun (it forwards the signal to the step), then `scancel` the run's
        steps that are still there, then SIGKILL the sruns."""
        for s in self.steps:
            if s.poll() is None:
                with contextlib.suppress(OSError):
                    s.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(s.poll() is None for s in self.steps):
            self._drain()
            time.sleep(POLL_S)
        if any(s.poll() is None for s in self.steps):
            self._cancel_steps()
        for s in self.steps:
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.wait(timeout=5)
            if s.poll() is None:
                with contextlib.suppress(OSError):
                    s.kill()
        for r in self.readers:
            if r.is_alive():  # the lines and files the steps sent before they ended
                r.join(timeout=5)
        self._drain()

    def _cancel_steps(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            listed = subprocess.run(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i|%j"],
                                    capture_output=True, text=True, timeout=15, env=self.env)
            for row in listed.stdout.splitlines():
                step, _, step_name = row.partition("|")
                if step_name == cmds.STEP_NAME:
                    subprocess.run(["scancel", "--signal=KILL", step], capture_output=True,
                                   timeout=15, env=self.env)


def node_main(index: int, plan_path: Path) -> int:
    """Inside the srun step on node `index`: that node's torchrun under the agent, its lines to
    stdout (srun carries them to the driver), ended with the step."""
    plan = json.loads(plan_path.read_text())
    travelled = plan.get("travel")
    if travelled and index in travelled["unseen"]:
        plan_path.unlink(missing_ok=True)  # a node-local copy, read once
    try:
        try:
            n = slurm_travel.placed(plan, index, _print)
        except Exception as exc:  # a failed setup, a damaged tar: the run's reason
            _print([workdir_ship.error_line(exc)])
            return 1
        return _run_node(plan, n)
    finally:
        if travelled and not plan["workdir"].get("keep"):
            with contextlib.suppress(OSError, ValueError):
                node_workdir.remove(slurm_clean.node_cache(), travelled["digest"],
                                    travelled["user"])


def _run_node(plan: dict[str, Any], n: dict[str, Any]) -> int:
    agent = NodeAgent(n["node_id"], plan["report_addr"])
    stopping = threading.Event()

    def on_signal(_sig: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=_take_orders, args=(agent, sys.stdin), daemon=True).start()
    key = {KEY_ENV: os.environ[KEY_ENV]} if KEY_ENV in os.environ else {}
    try:
        agent.start(n["argv"], {**n["env"], **key}, n["cwd"], n["sampling"], n.get("files_back"),
                    n.get("container"), n.get("run", ""))
    except RendezvousUnreachableError as exc:
        _print([f"RendezvousUnreachableError: {exc}"])
        return 1
    except ImageError as exc:
        _print([f"ImageError: {exc}"])
        return IMAGE_FAILED_EXIT
    while True:
        if stopping.is_set():
            agent.stop(grace_s=8.0)
            _print(agent.drain()[0])
            return 143
        lines, code = agent.drain()
        _print(lines)
        if code is not None:
            return code
        time.sleep(POLL_S)


def _take_orders(agent: NodeAgent, stdin: IO[str]) -> None:
    """The driver's orders (node_restart.py), as srun forwards them, to the node's agent."""
    with contextlib.suppress(OSError, ValueError):
        for line in iter(stdin.readline, ""):
            agent.decide(line)


def _print(lines: list[str]) -> None:
    for ln in lines:
        sys.stdout.write(ln + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args and args[0] == "--node":
        return node_main(int(args[1]), Path(args[2]))
    path = Path(args[0])
    driver = Driver(json.loads(path.read_text()), path)

    driver.catch_stop()
    return driver.run()


if __name__ == "__main__":
    sys.exit(main())
