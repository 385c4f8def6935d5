"""Restarts in place on a run of several nodes: every node's launcher stays alive, and the
driver carries the supervisor's decision to each of them.

On the local pool the supervisor writes its decision where the launcher reads it
(launch/warm_restart.py). A node of an SSH pool shares no file with the supervisor, so the
driver stands between them:

1. Each node's agent gives its launcher a restart file on the node's own disk (`NodeAgent`,
   when the node's plan entry has `GPUFLEET_RESTART_FILE`, whatever its value).
2. A node whose workers failed prints the launcher's `PARKED` line. The driver does not pass
   it on as it is (the supervisor would take one node's failure for the whole run's): `Parks`
   notes it and the line becomes the node's own (`waiting_line`).
3. Once every node waits, the driver prints one `PARKED` line; the supervisor steps its machine
   as for an exit and writes its decision beside the plan (`GPUFLEET_RESTART_FILE` in the
   driver's environment). If a node does not wait with the others within the driver's grace
   (its launcher ended, its workers went on or finished, its machine is gone), the waiting
   launchers are told to end, a lost node is looked for, the rest is ended and the driver
   exits: the next run starts fresh launchers, as before.
4. The driver sends the decision to every node as one line (`order_line`): `restart JSON` (the
   run's number, the variables that changed, whether it is the job's last run) or `end CODE`.
   The node writes it into its launcher's file (`NodeAgent.decide`).

A lost node still ends the run (its launcher is gone; the heal or a spare replaces it and the
next run starts fresh launchers everywhere). Pure: lines in, lines out.

The SSH, Ray and Slurm engines offer it (`offer`, in their `prepare`); their drivers carry
the orders on what already reaches each node: the ssh session's stdin beside the heartbeat, a
call to the node's Ray actor, the `srun` step's stdin.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.launch import frameworks
from gpufleet.launch.warm_restart import RESTART_FILE_VAR, Decision, parked_code, parked_run

DECISIONS = "restart.json"  # in the job folder, beside the plan: the supervisor's decision
RESTART = "restart "
END = "end "
OVER = "over"  # after an end's code: the job is over (warm_restart.Decision.over)


def offer(plan: dict[str, Any], env: dict[str, str], job_dir: Path, spec: Any) -> str:
    """Offer restarts in place to a multi-node `plan` whose launchers are warm (`spec.warm`,
    a torchrun-launched framework): the driver's `env` names where the supervisor writes its
    decision, and each node's entry asks its agent for a file of the node's own. Returns what
    must stay the same for a waiting run to take the next in place: the nodes and their
    devices (`Prepared.shape`; the driver's command is the same for any plan)."""
    if spec.warm and spec.framework in frameworks.WARM_FRAMEWORKS:
        env[RESTART_FILE_VAR] = str(job_dir / DECISIONS)
        for n in plan["nodes"]:
            n["env"][RESTART_FILE_VAR] = "node"
    return json.dumps([[n["node_id"], n["sampling"]["devices"]] for n in plan["nodes"]])


def order_line(decision: Decision, final: bool) -> str:
    """The decision as the line the driver sends each node (no newline)."""
    if decision.end is not None:
        return f"{END}{decision.end}" + (f" {OVER}" if decision.over else "")
    return RESTART + json.dumps({"run": decision.run, "env": decision.env, "final": final})


def parse_order(line: str) -> tuple[Decision, bool] | None:
    """(the decision, whether the next run is the job's last: for an end, whether the job is
    over) in an order line; None for any other line (a heartbeat, a stop) or a malformed one."""
    text = line.strip()
    try:
        if text.startswith(END.strip()):
            code, _, rest = text[len(END):].strip().partition(" ")
            if not code.lstrip("-").isdigit() or rest not in ("", OVER):
                return None
            return Decision(0, {}, int(code), over=rest == OVER), rest == OVER
        if text.startswith(RESTART.strip()):
            data = json.loads(text[len(RESTART):])
            return (Decision(int(data["run"]), {str(k): str(v) for k, v in data["env"].items()}),
                    bool(data.get("final", False)))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def waiting_line(code: int, run: int) -> str:
    """What a node's `PARKED` line becomes in the driver's output: the node's own news, not
    the run's (it does not match `warm_restart.parked_code`)."""
    return (f"gpufleet: this node's workers ended (exit code {code}, run {run}); "
            "its launcher waits with the other nodes")


@dataclass
class Parks:
    """Which nodes' launchers wait with their workers ended, in the order they said so."""

    count: int
    waiting: dict[int, tuple[int, int]] = field(default_factory=dict)  # node -> (code, run)

    def saw(self, node: int, line: str) -> str:
        """`line` as the driver prints it for node `node`; a `PARKED` line is noted."""
        code = parked_code(line)
        if code is None:
            return line
        run = parked_run(line)
        self.waiting[node] = (code, run)
        return waiting_line(code, run)

    def first(self) -> tuple[int, int, int] | None:
        """(node, exit code, run) of the first node that waits; None when none does."""
        for node, (code, run) in self.waiting.items():
            return node, code, run
        return None

    def all(self) -> bool:
        return len(self.waiting) == self.count

    def clear(self) -> None:
        self.waiting.clear()
