"""After a run on a Slurm pool whose nodes got a shipped workdir (slurm_travel): one short
clean-up step over those nodes removes the run's copy from each node's cache, with the
node-local tar and plan `sbcast` left, however the run ended.

Why a step after the run rather than the node's own `finally` alone: `gpufleet stop` SIGTERMs
the driver's whole process tree, the srun steps with it, and srun 22.05 then SIGKILLs its step,
so the node's clean-up never runs. No signal the driver could choose for srun to forward helps:
srun has the supervisor's SIGTERM before the driver can act. A run whose steps end by
themselves has already removed its copy; the step then finds nothing, which is harmless
(`node_workdir.remove` is idempotent and leaves a copy another job still uses).

The step runs the pool's node interpreter (`python -m gpufleet.backends.slurm_clean DIGEST
USER KEEP [PATH...]`) on the nodes that ran in a shipped copy and were not lost (a lost node's
slurmd would not answer). It is bounded by CLEAN_TIMEOUT_S; its failure is one warning line in
the run's log, never the run's reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpufleet.backends import node_workdir
from gpufleet.backends import slurm_cmds as cmds
from gpufleet.backends.image_leftovers import remove_job_containers

CLEAN_TIMEOUT_S = 30.0  # srun's step start and a Python on each node; far above the usual 1-3 s
MARK = "gpufleet-clean"  # what each node prints: `gpufleet-clean NODE OUTCOME`
KEEP, DROP = "keep", "drop"
NONE = "-"  # no shipped copy to remove on the nodes (a run in an image whose nodes see files)
EVERY = node_workdir.EVERY  # every digest the mark is on (slurm_spares: the job's, once done)
CONTAINERS = "--containers"  # then the job's name: its containers are removed too


def node_cache() -> Path:
    """The workdir cache of a Slurm node: $GPUFLEET_WORKDIR_CACHE only as set on the node
    (a TaskProlog's `export`; the driver drops the submitter's), else under the node user's
    own home, never the $HOME srun carries from the submitter."""
    return node_workdir.cache_root(os.environ, node_workdir.own_home())


def plan_step(plan: dict[str, Any], node_plans: Mapping[int, Path], lost: set[str],
              python: str) -> list[str] | None:
    """The clean-up step for a run (pure): over the nodes that ran in a shipped copy or in a
    container image and were not lost; None when there is nothing to clean."""
    nodes = cleaned_nodes(plan, lost)
    if not nodes:
        return None
    travelled = plan.get("travel") or {}
    keep = KEEP if (plan.get("workdir") or {}).get("keep") else DROP
    unseen = travelled.get("unseen") or []
    files = sorted({str(node_plans[i]) for i in unseen if i in node_plans})
    if travelled.get("tar"):
        files.insert(0, travelled["tar"])
    containers = [CONTAINERS, plan["job"]] if in_image(plan) else []
    argv = [python, "-m", "gpufleet.backends.slurm_clean", travelled.get("digest") or NONE,
            travelled.get("user") or NONE, keep, *containers, *files]
    return cmds.clean_step(plan["job_id"], [plan["nodes"][i]["node_id"] for i in nodes], argv)


def in_image(plan: dict[str, Any]) -> bool:
    return any(n.get("container") for n in plan["nodes"])


def cleaned_nodes(plan: dict[str, Any], lost: set[str]) -> list[int]:
    """The plan's nodes (by position) the clean-up step runs on: those that got a shipped
    copy, every node when the run was in an image (a killed step leaves its container)."""
    travelled = plan.get("travel") or {}
    chosen = set(travelled.get("unseen") or []) if travelled.get("digest") else set()
    if in_image(plan):
        chosen = set(range(len(plan["nodes"])))
    return sorted(i for i in chosen if plan["nodes"][i]["node_id"] not in lost)


def outcomes(output: str) -> dict[str, str]:
    """Each node's answer in the step's output: node name -> removed | in use | kept | absent."""
    found: dict[str, str] = {}
    for row in output.splitlines():
        parts = row.split(" ", 2)
        if len(parts) == 3 and parts[0] == MARK:
            found[parts[1]] = parts[2]
    return found


def report(what: str, asked: list[str], code: int | None, output: str, took_s: float) -> str:
    """The run's log line for the clean-up (pure): what each node did and how long the step
    took, or a warning naming the nodes that did not answer. `code` None: it timed out."""
    said = outcomes(output)
    done = ", ".join(f"{n} {said[n]}" for n in sorted(said))
    missing = [n for n in asked if n not in said]
    if code == 0 and not missing:
        return f"{what} clean-up in {took_s:.1f}s: {done}"
    why = (f"timed out after {CLEAN_TIMEOUT_S:.0f}s" if code is None else f"exit {code}")
    tail = " | ".join(ln.strip() for ln in output.splitlines() if ln.strip()
                      and not ln.startswith(MARK))[-300:]
    return (f"warning: {what} clean-up {why} ({took_s:.1f}s)"
            + (f"; no answer from {', '.join(missing)}" if missing else "")
            + (f"; done: {done}" if done else "") + (f": {tail}" if tail else ""))


def clean(plan: dict[str, Any], node_plans: Mapping[int, Path], lost: set[str],
          env: Mapping[str, str], say: Callable[[str], None]) -> None:
    """The driver's part, after every step of the run has ended: run the step, one line to
    `say`. Blocks at most CLEAN_TIMEOUT_S (srun killed then)."""
    argv = plan_step(plan, node_plans, lost, plan.get("node_python") or sys.executable)
    if argv is None:
        return
    asked = [plan["nodes"][i]["name"] for i in cleaned_nodes(plan, lost)]
    # the nodes answer with their Slurm node names; the log names them as the cluster does
    names = {n["node_id"]: n["name"] for n in plan["nodes"]}
    code: int | None
    started = time.monotonic()
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=CLEAN_TIMEOUT_S)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, output = None, text_of(exc.stdout) + text_of(exc.stderr)
    except OSError as exc:
        code, output = 127, str(exc)
    renamed = "\n".join(_renamed(ln, names) for ln in output.splitlines())
    what = ((plan.get("travel") or {}).get("digest") or "")[:12]
    say(report(f"workdir {what}" if what else "containers", asked, code, renamed,
               time.monotonic() - started))


def text_of(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""


def _renamed(line: str, names: Mapping[str, str]) -> str:
    parts = line.split(" ", 2)
    if len(parts) == 3 and parts[0] == MARK:
        return f"{MARK} {names.get(parts[1], parts[1])} {parts[2]}"
    return line


def node_main(args: list[str]) -> int:
    """On a node, inside the clean-up step: the run's copy removed from this node's cache
    (unless kept), the node-local files removed; one `gpufleet-clean NODE OUTCOME` line."""
    digest, user, keep, *files = args
    job = None
    if files[:1] == [CONTAINERS]:
        job, files = files[1], files[2:]
    for f in files:
        if f.startswith("/tmp/gpufleet-"):  # only what slurm_travel put there
            Path(f).unlink(missing_ok=True)
    root = node_cache()
    if digest == NONE:
        outcome = "no copy"
    elif digest == EVERY:
        released = node_workdir.remove_everywhere(root, user) if keep != KEEP else []
        outcome = "released" if released else "nothing marked"
    elif keep == KEEP:
        outcome = "kept"
    elif not root.is_dir():
        outcome = "absent"
    else:
        held = node_workdir.has(root, digest)
        removed = node_workdir.remove(root, digest, user)  # also a gone copy's markers
        outcome = "removed" if removed else "in use" if held else "absent"
    if job is not None:
        gone = remove_job_containers(job)
        outcome += (", no container runtime" if gone is None
                    else f", {gone} container(s) removed")
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    sys.stdout.write(f"{MARK} {node} {outcome}\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(node_main(sys.argv[1:]))
    except (ValueError, OSError) as exc:  # a digest that is not one; a cache it cannot touch
        sys.stderr.write(f"error: clean-up on this node: {exc}\n")
        sys.exit(2)
