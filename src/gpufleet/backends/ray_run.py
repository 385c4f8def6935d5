"""One run of a multi-node job on a Ray pool: a local driver and one `NodeAgent` actor per node.

`python -m gpufleet.backends.ray_run PLAN.json` is what the supervisor starts in place of
torchrun. It connects to Ray, starts an agent pinned to each of the cluster's nodes (node
affinity, not soft, holding the node's devices in Ray's own accounting so nothing else Ray runs
takes them), and each agent runs that node's torchrun; the watch over the nodes (fail fast,
lost nodes, stop) is `node_driver.NodeDriver`'s, shared with the Slurm driver. A node whose
agent Ray can no longer reach (its raylet or machine died) is lost.

Actors belong to this driver: if the driver dies, however it dies, Ray ends them, and each agent
runs its torchrun under a keeper (backends/keeper.py) that ends the node's whole tree when its
agent dies, so no worker outlives the job. (A parent-death signal on torchrun itself would fire
once per thread of the dying actor process, and a few SIGTERMs in a row can hang torchrun.)
Before any torchrun the driver asks each agent whether its node sees the job folder (a probe
file, backends/shipping.py); a node that does not gets the workdir through Ray's object store
(`_travel`), and `setup` runs once per node per workdir digest. The cluster's spare nodes
(`--spares`) are warmed with the same copy while the run goes on (ray_spares.py).
The agents also sample their node's devices once a second and send the samples to the
supervisor's report address, as workers send their reports, signed with the job's key: the
driver has it in its environment ($GPUFLEET_REPORT_KEY) and hands it to each agent with the
node's environment, never in the plan file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.backends import files_back, node_workdir, shipping, workdir_ship
from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.backends.node_driver import STOPPED_EXIT, NodeDriver, tag
from gpufleet.backends.node_ship import ShippingAgent
from gpufleet.backends.ray_spares import Spares
from gpufleet.launch import travel
from gpufleet.reportauth import KEY_ENV

PLACE_FAILED_EXIT = 70
READY_TIMEOUT_S = 60.0


class Driver(NodeDriver):
    """A run's nodes as Ray actors: one `NodeAgent` pinned to each node."""

    def __init__(self, plan: dict[str, Any], lost_path: Path | None = None,
                 plan_path: Path | None = None):
        super().__init__(plan, lost_path)
        self.plan_path = plan_path
        self.agents: list[Any] = []
        self.ray: Any = None
        self.done: dict[int, int] = {}
        self.travelled: tuple[str, set[int]] | None = None  # digest, nodes that placed or set up
        self.shipped: tuple[str, bytes, str] | None = None  # digest, tar, setup: for the spares
        self.spares: Spares | None = None
        self.final = bool(plan.get("final"))  # the job's last run (or restart in place)
        self.job = str(plan.get("job", "job"))  # the job's mark: on a spare's copy (ray_spares)
        self.user = f"{self.job}-{os.getpid()}"  # this run's mark on the copies

    def place(self) -> int | None:
        from gpufleet.backends.ray import connect
        from gpufleet.backends.ray_auth import env_token_path

        self.ray = ray = connect(self.plan["address"], env_token_path(os.environ))
        # ray.init put in a SIGTERM handler of its own that ends this process at once: a stop
        # would then leave the nodes' shipped copies behind (the agents die with their owner,
        # but nothing removes the copies). Ours again, so a stop ends the nodes and cleans up.
        self.catch_stop()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(ShippingAgent)
        for n in self.nodes:
            custom = dict(n["resources"])
            gpus = custom.pop("GPU", 0)  # Ray's own GPUs are asked for by num_gpus
            self.agents.append(remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["ray_id"], soft=False),
                num_cpus=0, num_gpus=gpus, resources=custom, max_restarts=0, max_concurrency=1,
            ).remote(n["node_id"], self.plan["report_addr"]))
        code = self._placed()
        if code is None:
            code = self._travel()
        if code is not None:
            return code
        key = {KEY_ENV: os.environ[KEY_ENV]} if KEY_ENV in os.environ else {}
        starts = [a.start.remote(n["argv"], {**n["env"], **key}, n["cwd"], n["sampling"],
                                 n.get("files_back"), n.get("container"), n.get("run", ""))
                  for a, n in zip(self.agents, self.nodes, strict=True)]
        try:
            ray.get(starts, timeout=READY_TIMEOUT_S)
        except Exception as exc:  # an agent that cannot start is a node failure
            self.say(f"could not start torchrun on every node: {type(exc).__name__}: {exc}")
            self.end_all(grace_s=5.0)
            return PLACE_FAILED_EXIT
        self.say(f"torchrun started on {len(self.nodes)} node(s): "
                 + ", ".join(f"{n['name']} ({n['address']})" for n in self.nodes))
        if self.shipped is not None and self.plan.get("spares"):
            self.spares = Spares(ray, remote, self.plan["spares"], self.job,
                                 self.plan["report_addr"], self.say)
            self.spares.warm(*self.shipped)
        return None

    def _placed(self) -> int | None:
        """Wait for every agent to be placed; an agent Ray cannot place (its node is gone, or
        its devices are held by something outside gpufleet) fails the run with the reason
        instead of waiting for ever."""
        ray = self.ray
        refs = [a.ready.remote() for a in self.agents]
        deadline = time.monotonic() + float(self.plan.get("ready_timeout_s", READY_TIMEOUT_S))
        pending = list(refs)
        while pending and time.monotonic() < deadline and not self.stop_asked:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
        failed: list[str] = []
        gone: set[str] = set()
        for ref, n in zip(refs, self.nodes, strict=True):
            if ref in pending:
                gone.add(n["node_id"])
                failed.append(f"{n['name']} ({n['address']}): not placed within "
                              f"{self.plan.get('ready_timeout_s', READY_TIMEOUT_S):.0f} s; the node "
                              f"is gone or Ray holds its {n['resources'] or 'devices'} for other work")
                continue
            try:
                ray.get(ref, timeout=5)
            except Exception as exc:
                gone.add(n["node_id"])
                failed.append(f"{n['name']} ({n['address']}): {type(exc).__name__}")
        if self.stop_asked:
            self.end_all(grace_s=0.0)
            return STOPPED_EXIT
        if failed:
            self.lost("cannot place the job's agent on " + "; ".join(failed), gone)
            self.end_all(grace_s=0.0)
            return NODE_LOST_EXIT if any("gone" in f or "Died" in f for f in failed) \
                else PLACE_FAILED_EXIT
        return None

    def _travel(self) -> int | None:
        """The workdir, before any torchrun: probe whether each node sees the job folder; to
        each that does not, the selection's tar through Ray's object store (one put, fetched
        only by the nodes that lack the digest), unpacked and set up by the node's agent, and
        that node's entry rewritten to run in its copy. The object store rather than
        `runtime_env` `working_dir`: the bytes are exactly the selection (Ray's own upload
        filters by its own rules), the node's cache and setup marker are those of the other
        engines, and the agents already on the nodes need no new worker processes."""
        section = self.plan.get("workdir")
        if not section or self.lost_path is None:
            return None
        ray, ids = self.ray, [n["node_id"] for n in self.nodes]
        sharing = shipping.probe(_AgentsSee(ray, self.agents, ids), ids, self.lost_path.parent)
        assert sharing is not None
        if not sharing.ships:
            self.say(workdir_ship.shared_line(section["root"]))
        if not workdir_ship.needed(section, sharing):
            return None
        try:
            packed = workdir_ship.pack(section, sharing.ships)
            digest, setup, user = packed.sel.digest, section["setup"], self.user
            unseen = [i for i, n in enumerate(self.nodes) if n["node_id"] in sharing.unseen]
            held = ray.get([self.agents[i].has_workdir.remote(digest) for i in unseen])
            tar = ray.put(packed.tar) if not all(held) else None
            calls = {i: self.agents[i].place_workdir.remote(
                digest, None if has else tar, setup, user, self.nodes[i]["name"])
                for i, has in zip(unseen, held, strict=True)}
            calls.update({i: a.set_up_shared.remote(section["root"], digest, setup,
                                                    self.nodes[i]["name"])
                          for i, a in enumerate(self.agents) if i not in calls and setup})
            self.travelled = (digest, set(calls))
            placed = dict(zip(calls, ray.get(list(calls.values())), strict=True))
        except Exception as exc:  # too large, outside, a failed setup: the run's reason
            self.poll()  # setup's lines so far, into the log
            sys.stdout.write(workdir_ship.error_line(exc) + "\n")
            self.end_all(grace_s=5.0)
            return PLACE_FAILED_EXIT
        if sharing.ships:
            self.shipped = (digest, packed.tar, setup)
        for i in unseen:
            self.nodes[i] = travel.on_node(self.nodes[i], section["root"], placed[i],
                                           str(self.lost_path.parent))
        if sharing.ships:
            self.say(workdir_ship.shipped_line(
                packed, [self.nodes[i]["name"] for i, h in zip(unseen, held, strict=True) if not h],
                tuple(self.nodes[i]["name"] for i, h in zip(unseen, held, strict=True) if h)))
        return None

    def _untravel(self, done: bool) -> None:
        """The shipped copies and setup markers off the nodes, unless the job keeps them;
        once the job is `done` (its last run ended), the spares' copies too, and the job's
        mark its nodes hold from when they were spares."""
        if self.travelled is None or (self.plan.get("workdir") or {}).get("keep"):
            return
        digest, where = self.travelled
        self.travelled = None
        if done and self.spares is not None:
            self.spares.release()
        # in order, one actor each: the run's mark, then the job's off every copy it is on (an
        # earlier run's digest too: a workdir the job writes into changes from run to run)
        marks = [(digest, self.user)] + ([(node_workdir.EVERY, self.job)] if done else [])
        refs = []
        for i in where:
            for on, mark in marks:
                with contextlib.suppress(Exception):
                    refs.append(self.agents[i].remove_workdir.remote(on, mark))
        with contextlib.suppress(Exception):
            self.ray.wait(refs, num_returns=len(refs), timeout=30)

    def run(self) -> int:
        code = super().run()
        self._untravel(code == 0 or self.stop_asked or self.final or self.over)
        if self.spares is not None:
            self.spares.close()
        return code

    def next_is_final(self) -> bool:
        """The plan the supervisor wrote for the run it asked for says whether it is the
        job's last: the spares' copies go after it."""
        if self.plan_path is not None:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                self.final = bool(json.loads(self.plan_path.read_text())["final"])
        return self.final

    def poll(self) -> tuple[dict[int, int], set[str]]:
        """Drain every live agent; an agent Ray cannot reach is a lost node."""
        live = [i for i in range(len(self.nodes)) if i not in self.done]
        refs = {i: self.agents[i].drain.remote() for i in live}
        for i, ref in refs.items():
            try:
                lines, code = self.ray.get(ref, timeout=30)
            except Exception:  # ActorDiedError, unavailable, timeout: the node
                return dict(self.done), {self.nodes[i]["node_id"]}
            name = self.nodes[i]["name"]
            for line in lines:
                if self.lost_path is not None and files_back.write_back(self.lost_path.parent,
                                                                         line):
                    continue  # a file the node sent back (files_back.py), not a log line
                sys.stdout.write(tag(name, self.parks.saw(i, line)) + "\n")
            sys.stdout.flush()
            if code is not None:
                self.done[i] = code
        return dict(self.done), set()

    def relay(self, line: str) -> None:
        """An order (node_restart.py) to every node's agent; an agent that cannot take it is
        a node the next poll finds lost."""
        refs = []
        for a in self.agents:
            with contextlib.suppress(Exception):
                refs.append(a.decide.remote(line))
        with contextlib.suppress(Exception):
            self.ray.wait(refs, num_returns=len(refs), timeout=30)

    def confirm_lost(self) -> tuple[set[str], str]:
        time.sleep(1.0)
        return self.poll()[1], "its raylet or machine died"

    def lost_text(self, lost: set[str], how: str) -> str:
        where = ", ".join(f"{n['name']} ({n['address']})" for n in self.nodes
                          if n["node_id"] in lost)
        return (f"node {where} left the Ray cluster mid-job (its raylet or machine died); "
                "ending the other nodes")

    def end_all(self, grace_s: float) -> None:
        ray, refs = self.ray, []
        for a in self.agents:
            with contextlib.suppress(Exception):
                refs.append(a.stop.remote(grace_s))
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=grace_s + 15)
        with contextlib.suppress(Exception):
            self.poll()  # what the nodes printed while ending (a summary of failed ranks)
        self._untravel(self.stop_asked or self.final or self.over)  # while the agents live
        if self.spares is not None:
            self.spares.close()
        for a in self.agents:
            with contextlib.suppress(Exception):
                ray.kill(a)


class _AgentsSee:
    """shipping.SharesFiles through the run's agents, already one on each node."""

    def __init__(self, ray: Any, agents: list[Any], ids: list[str]):
        self.ray, self.agents, self.ids = ray, agents, ids

    def sees(self, node_ids: Sequence[str], path: Path, content: str,
             ref: str = "") -> dict[str, bool]:
        refs = [a.sees.remote(str(path), content) for a in self.agents]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=shipping.PROBE_TIMEOUT_S)
        seen: dict[str, bool] = {}
        for i, r in zip(self.ids, refs, strict=True):
            if r in ready:
                with contextlib.suppress(Exception):  # an agent that died answers nothing
                    seen[i] = bool(self.ray.get(r))
        return seen


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0])
    plan = json.loads(path.read_text())
    # Ray's own chatter (raylet state dumps, warnings) goes to a file, not the job's log
    with open(path.with_name("ray-driver.log"), "ab") as noise:
        os.dup2(noise.fileno(), 2)
    driver = Driver(plan, path.with_suffix(".lost"), path)
    driver.catch_stop()
    return driver.run()


if __name__ == "__main__":
    sys.exit(main())
