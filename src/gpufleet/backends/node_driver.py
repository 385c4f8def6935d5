"""What a multi-node run's driver does whatever the engine: the node tags on every line, and
the watch over the nodes (fail fast, lost nodes, restarts in place, stop on SIGTERM).

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
- a node whose warm launcher waits with its workers ended (launch/warm_restart.py) is not
  ended: once every node's waits, the driver says so once and carries the supervisor's
  decision to every node (`in_place`, node_restart.py), so a restart keeps every launcher;
- it exits 0 when every node's torchrun did;
- on SIGTERM (`stop_asked`) it ends every node and exits 143.

On each node, `node_agent.NodeAgent` runs the node's torchrun under a keeper.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any

from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.backends.node_restart import Parks, order_line
from gpufleet.launch import warm_restart
from gpufleet.launch.warm_restart import RESTART_FILE_VAR, Decision

POLL_S = 0.2
# After a node's own failure, how long the other nodes get to end by themselves before they are
# signalled: their torchrun prints the summary naming its own failed ranks only once it noticed
# them, and SIGTERM before that (a busy machine, a second or two) leaves no summary at all, so
# the job's failure was blamed on the victim that ended first. A peer's death reaches every
# rank within moments (a closed connection), so the wait ends long before this as a rule.
PEERS_END_S = 5.0
STOPPED_EXIT = 143  # the driver's exit after a stop: as a process ended by SIGTERM


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
        # restarts in place (node_restart.py): where the supervisor writes its decision, which
        # nodes wait for it, and the run the nodes' launchers are on
        self.decisions = os.environ.get(RESTART_FILE_VAR)
        self.parks = Parks(len(self.nodes))
        env0 = self.nodes[0].get("env", {}) if self.nodes else {}
        self.run_no = int(env0.get(warm_restart.RUN_VAR, "0") or 0)
        self.over = False  # the supervisor's end said the job is over (carry_decision)

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

    def relay(self, line: str) -> None:
        """Send an order line (node_restart.py) to every node's agent; engines whose plans
        offer restarts in place (`GPUFLEET_RESTART_FILE` in a node's entry) fill this in."""
        raise NotImplementedError

    def next_is_final(self) -> bool:
        """Whether the run the supervisor just asked for is the job's last (the plan it
        wrote for it says): the nodes let the job's workdir go after it."""
        return False

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
                return self.ended_lost(lost, how)
            if failed is not None:
                i, code = failed
                self.say(f"node {self.nodes[i]['name']} exited with code {code}; ending the "
                         "other nodes")
                self.let_peers_end(len(ended))
                self.end_all(grace_s=10.0)
                return code
            if self.parks.first() is not None:
                ends = self.in_place()
                if ends is not None:
                    return ends
                continue
            if len(ended) == len(self.nodes):
                return 0
            time.sleep(POLL_S)

    def ended_lost(self, lost: set[str], how: str) -> int:
        self.lost(self.lost_text(lost, how), lost)
        self.end_all(grace_s=5.0)
        return NODE_LOST_EXIT

    def in_place(self) -> int | None:
        """A node's launcher waits with its workers ended (node_restart.py): once every node's
        does, one `PARKED` line for the supervisor and its decision carried to every node. The
        driver's exit code when the run ends here; None when the nodes restart in place (or a
        stop was asked, which the watch answers). No lost node is looked for while the nodes
        come to wait: a lost node shows as one that does not (and Slurm's look asks the live
        steps to end)."""
        first = self.parks.first()
        assert first is not None
        _node, code, run = first
        deadline = time.monotonic() + PEERS_END_S
        while not self.parks.all():
            if self.stop_asked:
                return None
            ended, lost = self.poll()
            if lost:
                return self.ended_lost(lost, "")
            if ended or time.monotonic() > deadline:
                others = ", ".join(n["name"] for i, n in enumerate(self.nodes)
                                   if i not in self.parks.waiting)
                return self.not_in_place(code, f"the launcher on {others} did not wait with "
                                         f"the others within {PEERS_END_S:.0f} s")
            time.sleep(POLL_S)
        sys.stdout.write(warm_restart.parked_line(code, run) + "\n")
        sys.stdout.flush()
        return self.carry_decision(code)

    def not_in_place(self, code: int, why: str) -> int:
        """The run ends without a restart in place: the waiting launchers end as plain torchrun
        would have (quietly, their nodes' clean-up run), then a lost node is looked for, then
        what is left is ended. The next run starts new launchers."""
        waiting = set(self.parks.waiting)
        self.relay(order_line(Decision(0, {}, end=code), False))
        deadline = time.monotonic() + PEERS_END_S
        while time.monotonic() < deadline and not waiting <= set(self.poll()[0]):
            time.sleep(POLL_S)
        lost, how = self.confirm_lost()
        if lost:
            return self.ended_lost(lost, how)
        self.say(f"{why}: ending every node; the next run starts new launchers")
        self.end_all(grace_s=10.0)
        return code

    def carry_decision(self, code: int) -> int | None:
        """Wait for the supervisor's decision (while answering a stop and noticing a node that
        goes) and send it to every node: None once they restart, the exit code once they end."""
        path = Path(self.decisions) if self.decisions else None
        polled = time.monotonic()
        while True:
            if self.stop_asked:
                return None
            found = warm_restart.read(path) if path is not None else None
            if found is not None and (found.end is not None or found.run > self.run_no):
                break
            if time.monotonic() - polled >= POLL_S:
                polled = time.monotonic()
                ended, lost = self.poll()
                if lost:
                    return self.ended_lost(lost, "")
                if ended:
                    gone = ", ".join(self.nodes[i]["name"] for i in sorted(ended))
                    return self.not_in_place(code, f"{gone} ended while the run waited for "
                                             "the supervisor")
            time.sleep(warm_restart.POLL_S)
        if found.end is not None:
            self.over = found.over  # the job is over: the spares' copies go too
            self.relay(order_line(found, found.over))
            self.let_peers_end(len(self.poll()[0]))
            self.end_all(grace_s=5.0)
            return found.end
        self.relay(order_line(found, self.next_is_final()))
        self.parks.clear()
        self.run_no = found.run
        return None
