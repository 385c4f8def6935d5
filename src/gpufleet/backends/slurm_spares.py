"""Spare nodes on a Slurm pool (`--spares N`): warmed while each run trains, let go with the job.

Slurm grants the spares with the cluster's own nodes, in one allocation made with `--no-kill`
(a node's failure does not end it), so a lost node is replaced by a spare of the same
allocation with no wait in Slurm's queue (lifecycle/engine_heal.py). No step of a run uses a
spare. While the run's steps train, the driver starts one more step over the spares
(`python -m gpufleet.backends.slurm_spares PLAN`): each spare places the copy of the workdir
the run shipped (`sbcast` put the tar and the plan on every node of the allocation, the
spares' included) or, when the run shipped nothing (its nodes see the job folder), uses that
folder, and runs the job's setup once. The copy or the setup's marker is marked with the job's
name (node_workdir's users), so the run's own clean-up leaves it: after a heal, the run on the
former spare runs no setup and unpacks nothing again.

When the job is done (a run succeeded, was stopped, was the job's last, or the supervisor's
end said the job is over) one short step over the nodes and the spares drops that mark from
every copy it is on (an earlier run's too: a workdir the job writes into changes its digest):
the copies and markers go where no other job uses them (slurm_clean's node side does it).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpufleet.backends import node_workdir, slurm_clean
from gpufleet.backends import slurm_cmds as cmds

MARK = "gpufleet-warm"  # each spare's lines: `gpufleet-warm NODE say|done|failed TEXT`
WARM_STEP = "gpufleet-warm"
WARM_END_S = 5.0  # how long a warm step still running at the run's end is given once told


def spare_ids(plan: dict[str, Any], lost: set[str] | None = None) -> list[str]:
    """The spares' Slurm node names the run's plan lists, less `lost`."""
    return [s["node_id"] for s in plan.get("spares") or [] if s["node_id"] not in (lost or ())]


def warm_argv(plan: dict[str, Any], plan_path: Path, python: str) -> list[str] | None:
    """The step that warms the spares (pure): None without spares or with nothing to warm
    (no workdir travels and no setup). The spares read the plan where the run's unseen nodes
    do: the node-local copy `sbcast` left when the run shipped, else the job folder's."""
    travelled = plan.get("travel")
    ids = spare_ids(plan)
    if not ids or not travelled:
        return None
    where = str(plan_path)
    if travelled.get("unseen"):
        where = cmds.node_local("plan", f"{travelled['user']}.json")
    return cmds.spread_step(plan["job_id"], ids, WARM_STEP,
                            [python, "-m", "gpufleet.backends.slurm_spares", where])


def release_argv(plan: dict[str, Any], lost: set[str], python: str) -> list[str] | None:
    """The step that drops the job's mark on the nodes and the spares once the job is done
    (pure); None for a cluster never launched with spares, with nothing to warm, or when the
    job keeps its workdir. It also removes what `sbcast` left on a spare whose warm step never
    ran. A run whose workdir could not travel (its `travel` missing: an sbcast that failed)
    still drops the mark an earlier run's warm step left."""
    travelled = plan.get("travel") or {}
    spares = spare_ids(plan, lost)
    section = plan.get("workdir")
    if not plan.get("spared") or not section or section.get("keep"):
        return None  # spared: a node of the run may be a former spare, which holds the mark
    nodes = [n["node_id"] for n in plan["nodes"] if n["node_id"] not in lost]
    files = []
    if travelled.get("unseen"):
        files = [cmds.node_local("plan", f"{travelled['user']}.json")]
        if travelled.get("tar"):
            files.insert(0, travelled["tar"])
    argv = [python, "-m", "gpufleet.backends.slurm_clean", slurm_clean.EVERY, plan["job"],
            slurm_clean.DROP, *files]
    return cmds.spread_step(plan["job_id"], list(dict.fromkeys(nodes + spares)),
                            cmds.CLEAN_STEP, argv)


def said(line: str) -> tuple[str, str, str] | None:
    """A spare's line in the warm step's output: (node, what, text); None for another line."""
    parts = line.rstrip("\n").split(" ", 3)
    if len(parts) >= 3 and parts[0] == MARK and parts[2] in ("say", "done", "failed"):
        return parts[1], parts[2], parts[3] if len(parts) == 4 else ""
    return None


class Warming:
    """The driver's side: the warm step in a thread of its own, each spare's outcome said in
    the job's log as it comes (`spare n3 warm in 1.4 s: setup ran`, or `... not warmed:
    REASON`); `stop` ends a step still running when the run ends (a setup cut short leaves
    no marker: the next run's warm step tries again)."""

    def __init__(self, argv: list[str], env: Mapping[str, str], say: Callable[[str], None],
                 asked: list[str]):
        self.argv, self.env, self.say, self.asked = argv, dict(env), say, asked
        self.proc: subprocess.Popen[str] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.started = threading.Event()
        self.stopping = False

    def start(self) -> None:
        self.thread.start()
        self.started.wait(timeout=30)

    def _run(self) -> None:
        heard: set[str] = set()
        tail: list[str] = []
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         text=True, start_new_session=True)
        except OSError as exc:
            self.started.set()
            self.say(f"spares not warmed: {exc}")
            return
        self.started.set()
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            got = said(line)
            if got is None:
                if line.strip():
                    tail = [*tail, line.strip()][-3:]
                continue
            node, what, text = got
            if what == "say":
                self.say(f"spare {node}: setup: {text}")
            else:
                heard.add(node)
                self.say(f"spare {node} warm in {text}" if what == "done"
                         else f"spare {node} not warmed: {text}")
        code = self.proc.wait()
        missing = [n for n in self.asked if n not in heard]
        if missing and self.stopping:
            self.say(f"spare(s) {', '.join(missing)} not warmed: the run ended first")
        elif missing:
            why = " | ".join(tail) or "no output"
            self.say(f"spare(s) {', '.join(missing)} not warmed: the warm step ended (exit "
                     f"{code}): {why[:300]}")

    def stop(self) -> None:
        """End the step if it still runs (SIGTERM through srun, then SIGKILL), then wait for
        its last lines."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self.stopping = True
            with contextlib.suppress(OSError):
                proc.terminate()
            try:
                proc.wait(timeout=WARM_END_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    proc.kill()
        self.thread.join(timeout=WARM_END_S + 5)


def release(plan: dict[str, Any], lost: set[str], env: Mapping[str, str],
            say: Callable[[str], None]) -> None:
    """The driver's part once the job is done: the release step, one line to `say`."""
    argv = release_argv(plan, lost, plan.get("node_python") or sys.executable)
    if argv is None:
        return
    asked = list(dict.fromkeys([n["node_id"] for n in plan["nodes"] if n["node_id"] not in lost]
                               + spare_ids(plan, lost)))
    started = time.monotonic()
    code: int | None
    try:
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=slurm_clean.CLEAN_TIMEOUT_S)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, output = None, slurm_clean.text_of(exc.stdout) + slurm_clean.text_of(exc.stderr)
    except OSError as exc:
        code, output = 127, str(exc)
    say(slurm_clean.report(f"job {plan['job']}'s workdir mark (nodes and spares)", asked, code,
                           output, time.monotonic() - started))


# -- on a spare, inside the warm step ------------------------------------------------------------


def node_main(plan_path: Path) -> int:
    """Place the run's shipped copy (or use the folder the node sees) and run the setup once,
    marked with the job's name; one `done` or `failed` line for the driver."""
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    started = time.monotonic()

    def out(what: str, text: str) -> None:
        sys.stdout.write(f"{MARK} {node} {what} {text}\n")
        sys.stdout.flush()

    try:
        plan = json.loads(plan_path.read_text())
        travelled = plan["travel"]
        if travelled.get("unseen"):
            plan_path.unlink(missing_ok=True)  # the node-local copy sbcast left, read once
        outcome = _warm(plan, travelled, node, lambda t: out("say", t))
    except Exception as exc:  # a failed setup, no tar, a folder it cannot see: the reason
        out("failed", f"{type(exc).__name__}: {exc}")
        return 1
    out("done", f"{time.monotonic() - started:.1f} s: {outcome}")
    return 0


def _warm(plan: dict[str, Any], travelled: dict[str, Any], node: str,
          say: Callable[[str], None]) -> str:
    section = plan.get("workdir") or {}
    setup, digest, root = section.get("setup", ""), travelled["digest"], slurm_clean.node_cache()
    root.mkdir(parents=True, exist_ok=True)
    ran = bool(setup) and not node_workdir.setup_marker(root, digest, setup).exists()
    if travelled.get("unseen"):
        held = node_workdir.has(root, digest)
        tar = Path(travelled["tar"]) if travelled.get("tar") and not held else None
        try:
            with contextlib.ExitStack() as stack:
                stream = stack.enter_context(open(tar, "rb")) if tar is not None else None
                node_workdir.place(root, digest, stream, setup, say, node=node,
                                   user=plan["job"])
        finally:
            if travelled.get("tar"):
                Path(travelled["tar"]).unlink(missing_ok=True)
        where = f"workdir {digest[:12]} " + ("already here" if held else "placed")
    else:
        folder = Path(section["root"])
        if not folder.is_dir():
            raise FileNotFoundError(f"{node} does not see the workdir {folder}")
        node_workdir.set_up(root, digest, folder, setup, say, node=node, user=plan["job"])
        where = f"workdir {folder} seen here"
    return where + (", setup ran" if ran else ", setup done before" if setup else "")


if __name__ == "__main__":
    sys.exit(node_main(Path(sys.argv[1])))
