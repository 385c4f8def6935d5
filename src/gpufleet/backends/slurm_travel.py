"""The workdir on a Slurm pool whose nodes do not see the job folder (issue 29): what the
driver does before its steps (`ship`, with the pure `travel_plan`), and what each node's step
does before its torchrun (`placed`).

The driver probes with one step over the allocation (each node prints what it reads at a probe
file in the job folder); where every node sees it nothing is shipped (a shared file system, the
test Slurm on this machine). Otherwise `sbcast` puts the selection's tar and the plan on each
node's /tmp, and the node's step unpacks the tar into the node's cache under its digest
(node_workdir.place, with setup once per node per digest), runs in that copy, and removes it at
the end unless the job keeps it. The node's interpreter is the pool's (`pool add slurm
--python`, slurm_run.node_argv).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpufleet.backends import node_workdir, shipping, slurm_clean, workdir_ship
from gpufleet.backends import slurm_cmds as cmds
from gpufleet.errors import GpufleetError
from gpufleet.launch import travel


def travel_plan(plan: dict[str, Any], plan_path: Path, unseen: list[int], digest: str,
                tar_path: Path | None, user: str) -> tuple[dict[str, Any], list[list[str]],
                                                           dict[int, Path]]:
    """What the driver does for the workdir (pure): the plan as the nodes read it (its
    `travel` entry: the digest, the nodes that run in a shipped copy, where the tar lands on
    them), the `sbcast` commands that put the tar and that plan on node-local storage, and the
    plan file each node's step reads (node-local where the node does not see the job folder)."""
    job_id = plan["job_id"]
    tar_dest = cmds.node_local("workdir", f"{digest[:16]}.tar.gz") if tar_path else None
    travelled = {**plan, "travel": {"digest": digest, "unseen": unseen, "tar": tar_dest,
                                    "user": user, "job_dir": str(plan_path.parent)}}
    steps: list[list[str]] = []
    plans = {i: plan_path for i in range(len(plan["nodes"]))}
    if unseen:
        if tar_path is not None and tar_dest is not None:
            steps.append(cmds.sbcast(job_id, str(tar_path), tar_dest))
        local_plan = cmds.node_local("plan", f"{user}.json")
        steps.append(cmds.sbcast(job_id, str(plan_path), local_plan))
        plans.update({i: Path(local_plan) for i in unseen})
    return travelled, steps, plans


class _Sees:
    """shipping.SharesFiles over a function (the driver's probe step)."""

    def __init__(self, ask: Callable[[Path, str], dict[str, bool]]):
        self.ask = ask

    def sees(self, node_ids: Sequence[str], path: Path, content: str,
             ref: str = "") -> dict[str, bool]:
        return self.ask(path, content)


def ship(plan: dict[str, Any], plan_path: Path, job_id: str, env: dict[str, str],
         say: Callable[[str], None],
         out: Callable[[list[str]], None]) -> tuple[dict[str, Any], dict[int, Path]] | None:
    """The driver's part, before any torchrun: one probe step tells which nodes see the job
    folder; to the others `sbcast` carries the selection's tar and the plan to node-local
    /tmp. Returns the plan as the nodes read it and the plan file each node's step reads;
    None after a `WorkdirError:` line to `out` (the run's reason) when it cannot travel."""
    nodes = plan["nodes"]
    node_plans = {i: plan_path for i in range(len(nodes))}
    section = plan.get("workdir")
    if not section:
        return plan, node_plans
    ids = [n["node_id"] for n in nodes]

    def seen_here(path: Path, content: str) -> dict[str, bool]:
        try:
            done = subprocess.run(cmds.sees_step(job_id, ids, str(path)), env=env,
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=shipping.PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        return cmds.seen_by(done.stdout, content)

    sharing = shipping.probe(_Sees(seen_here), ids, plan_path.parent)
    assert sharing is not None
    if not sharing.ships:
        say(workdir_ship.shared_line(section["root"]))
    if not workdir_ship.needed(section, sharing):
        return plan, node_plans
    tar_path: Path | None = None
    try:
        packed = workdir_ship.pack(section, sharing.ships)
        digest = packed.sel.digest
        if sharing.ships:
            tar_path = plan_path.parent / f"workdir-{digest[:12]}.tar.gz"
            tar_path.write_bytes(packed.tar)
        unseen = [i for i, n in enumerate(nodes) if n["node_id"] in sharing.unseen]
        plan, steps, node_plans = travel_plan(plan, plan_path, unseen, digest, tar_path,
                                              f"{plan.get('job', 'job')}-{os.getpid()}")
        plan_path.write_text(json.dumps(plan, indent=1))
        for argv in steps:
            done = subprocess.run(argv, env=env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=300)
            if done.returncode != 0:
                judge_bcast(argv, done.stderr, ids, say)
    except (GpufleetError, OSError, subprocess.TimeoutExpired) as exc:
        out([workdir_ship.error_line(exc)])
        return None
    finally:
        if tar_path is not None:
            tar_path.unlink(missing_ok=True)
    if sharing.ships:
        say(workdir_ship.shipped_line(packed, [nodes[i]["name"] for i in unseen]))
    return plan, node_plans


def judge_bcast(argv: list[str], stderr: str, ids: list[str],
                say: Callable[[str], None]) -> None:
    """A failed `sbcast` is the run's failure unless every node it did not reach is outside
    the run (a lost node the allocation still lists, or a spare): then it is said and the run
    goes on, since its own nodes have the file."""
    why = " ".join(stderr.split())[:300]
    missed = cmds.bcast_missed(stderr)
    if missed is None or set(missed) & set(ids):
        raise GpufleetError(f"`{cmds.line(argv)}` failed: {why}")
    say(f"sbcast did not reach {', '.join(missed)}, not a node of this run (a lost node "
        f"Slurm has not marked down yet, or a spare): {why}")


def placed(plan: dict[str, Any], index: int, out: Callable[[list[str]], None]) -> dict[str, Any]:
    """The node's plan entry, run in the shipped copy where the node does not see the job
    folder (unpacked from the node-local tar `sbcast` left), setup run once either way."""
    n: dict[str, Any] = plan["nodes"][index]
    travelled, section = plan.get("travel"), plan.get("workdir") or {}
    if not travelled:
        return n
    root, digest = slurm_clean.node_cache(), travelled["digest"]

    def say(line: str) -> None:
        out([f"setup: {line}"])

    if index not in travelled["unseen"]:
        if section.get("setup"):
            node_workdir.set_up(root, digest, Path(section["root"]), section["setup"], say,
                                node=n["name"])
        return n
    tar = Path(travelled["tar"]) if travelled.get("tar") else None
    try:
        with contextlib.ExitStack() as stack:
            stream = stack.enter_context(open(tar, "rb")) if tar is not None else None
            folder = node_workdir.place(root, digest, stream, section.get("setup", ""), say,
                                        node=n["name"], user=travelled["user"])
    finally:
        if tar is not None:
            tar.unlink(missing_ok=True)
    return travel.on_node(n, section["root"], str(folder), travelled["job_dir"])
