"""A Ray pool whose nodes are test machines that share nothing with the submitter
(scripts/test-machines): a raylet in each of the three machines, run by the machine's own node
environment; a job from a folder only the submitter has, shipped to two of them, the third held
as its spare (`--spares 1`) and warmed while the first run trains (the copy placed, the setup
run); one of the two killed mid-job and replaced by the spare, which is sent nothing and sets up
nothing, resuming from the durable checkpoint copy; then nothing left, the spare's copy included.

Where the head runs, and why: in the root namespace, on the submitter's address on the
machines' bridge. gpufleet's run driver (`ray_run`) is a Ray driver, and Ray attaches a driver
to a raylet on its own host, so the submitter must be a node of the cluster; the head offers no
devices (no gpufleet labels, no GPUs), so jobs land only on the machines. The head runs Ray
from the node environment (Python 3.11.X of the system, as the team's nodes have), while the
submitter's driver runs from the checkout's .venv, whose Python may differ in the patch level:
the cluster is the team's, the submitter a laptop.

The durable checkpoint folder is one every machine and the submitter see at one path (a
folder under /run, which the machines do not hide), as a team's NFS share would be.

The pool's Ray token reaches each machine over ssh on stdin, into a file of the machine's own
disk, and each raylet is given its path: no token on any command line (checked on every process
of the machines). One module fixture starts the cluster and one job; the tests read it in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from fleet_helpers import EXAMPLES, Fleet
from machines import Machines, machines_or_skip

from gpufleet.backends import ray_auth, ray_local
from gpufleet.backends.proc_tree import terminate
from gpufleet.backends.ray import LABEL_GPU, LABEL_NODE, LABEL_SIMULATED, RESOURCE

JOB = "gm"
PER_NODE = 2
RAY_START_TIMEOUT_S = 120  # a wait on a loaded machine, never a verdict
# `ray start` gives a raylet a fixed 30 s to register with the head (Ray's node.py), which a
# machine loaded many times over can miss: a start that failed so is cleaned up and tried again
START_TRIES = 3
SETUP = "echo warming up"
TINY = ["--layers", "1", "--dim", "32", "--heads", "2", "--batch-size", "8", "--max-bytes",
        "200000", "--val-windows", "8", "--sample-bytes", "10", "--log-every", "10"]


@dataclass
class RayOnMachines:
    machines: Machines
    fleet: Fleet
    head: ray_local.LocalRay  # only its marker and address: the head's processes are found by it
    token: str
    token_name: str  # the token's file on each machine's own disk (/srv/machine/NAME)
    durable: Path
    workdir: Path
    killed: str = ""
    killed_at: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _start_head(m: Machines, cfg: ray_local.LocalRay) -> None:
    """The head, in the root namespace on the submitter's bridge address, with Ray from the
    node environment's interpreter (DIR/m1/env on this side); marked so its daemons are found."""
    python = m.folder / "m1" / "env" / "bin" / "python"
    argv = [str(python), "-m", "ray.scripts.scripts", "start", "--head",
            "--node-ip-address", cfg.head_ip, "--port", str(cfg.port),
            "--num-cpus", "1", "--num-gpus", "0", "--labels", f"{LABEL_NODE}=submitter",
            "--object-store-memory", str(80 * 2**20), "--include-dashboard", "false",
            "--disable-usage-stats", "--temp-dir", str(ray_local.temp_dir(cfg))]
    env = {**ray_auth.auth_env(os.environ, Path(cfg.token_file)),
           ray_local.POOL_MARK: cfg.mark}
    for attempt in range(1, START_TRIES + 1):
        done = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=RAY_START_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if done.returncode == 0:
            return
        terminate(ray_local.processes(cfg), 10.0)  # what the failed start left, by its marker
        assert attempt < START_TRIES, ray_local.error_line(done.stdout + done.stderr)


def _start_raylet(m: Machines, name: str, head: str, token_name: str) -> None:
    """A raylet inside machine `name`, by the machine's own node environment, declaring two
    simulated H100s; the token by the path of its file on the machine's disk."""
    labels = f"{LABEL_NODE}={name},{LABEL_GPU}=H100,{LABEL_SIMULATED}=true"
    python = m.python(name)
    cmd = ["env", "RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH=/srv/machine/{token_name}",
           python, "-m", "ray.scripts.scripts", "start", "--address", head,
           "--node-ip-address", m.address(name), "--num-cpus", "1", "--num-gpus", "0",
           "--resources", json.dumps({RESOURCE: PER_NODE}), "--labels", labels,
           "--object-store-memory", str(80 * 2**20), "--disable-usage-stats",
           "--temp-dir", "/tmp/ray"]
    for attempt in range(1, START_TRIES + 1):
        done = m.run(name, cmd, timeout=RAY_START_TIMEOUT_S, check=False)
        if done.returncode == 0:
            return
        left = _end_machine(m, name)  # what the failed start left
        assert attempt < START_TRIES and not left, \
            f"{name}: {ray_local.error_line(done.stdout + done.stderr)}"


def _end_machine(m: Machines, name: str) -> list[int]:
    """End every process of the machine but its sshd (the raylet and what Ray started) by
    pid: SIGTERM, SIGKILL after 10 s; the pids still there after that."""
    procs = []
    for pid in m.pids(name):
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    terminate(procs, 10.0)
    deadline = time.monotonic() + 30
    while (left := m.pids(name)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _job_pids(m: Machines, name: str, job: str) -> list[int]:
    """The machine's processes that carry the job (GPUFLEET_JOB in their environment)."""
    found = []
    needle = f"\0GPUFLEET_JOB={job}\0".encode()
    for pid in m.pids(name):
        with contextlib.suppress(OSError):
            if needle in b"\0" + Path(f"/proc/{pid}/environ").read_bytes() + b"\0":
                found.append(pid)
    return found


def _cmdlines(m: Machines, name: str) -> list[str]:
    out = []
    for pid in m.pids(name):
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return out


def _script_cwds(m: Machines, name: str, script: str) -> list[str]:
    """Where the machine's processes running `script` run (as the machine sees the path)."""
    out = []
    for pid in m.pids(name):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if script.encode() in argv:
                out.append(os.readlink(f"/proc/{pid}/cwd"))
    return out


@pytest.fixture(scope="module")
def rm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayOnMachines]:
    m = machines_or_skip()
    assert len(m.names) >= 3, "the test needs three machines"
    base = tmp_path_factory.mktemp("raymach")
    fleet = Fleet(base / "home", base / "home-of-alice" / "proj", slots=2)
    workdir = fleet.cwd  # under /tmp: hidden from every machine
    shutil.copy(EXAMPLES / "gpt.py", workdir / "train.py")
    # a digest of its own: a copy a machine kept from an earlier run is never this one
    (workdir / "run.txt").write_text(f"{base}\n")
    token_file = base / "ray-token"
    ray_auth.new_token(token_file)
    token = token_file.read_text().strip()
    cfg = ray_local.LocalRay(name=f"raymach{os.getpid() % 100000}", nodes=1, gpu="cpu",
                             per_node=0, fabric="pcie", network="ethernet",
                             head_ip=m.submitter, port=_free_port(m.submitter),
                             token_file=str(token_file))
    token_name = f"ray-token-{cfg.name}"
    durable = Path(tempfile.mkdtemp(prefix="gfrm-", dir="/run"))  # not hidden from the machines
    state = RayOnMachines(m, fleet, cfg, token, token_name, durable, workdir)
    try:
        for name in m.names:  # the token over ssh's stdin, into the machine's own disk
            put = subprocess.run(m.ssh_argv(name, f"umask 077; cat > /srv/machine/{token_name}"),
                                 input=token, capture_output=True, text=True, timeout=60)
            assert put.returncode == 0, put.stderr
            m.run(name, f"test -d {durable} && test ! -e {workdir}")  # sees the share, not ours
        _start_head(m, cfg)
        for name in m.names:  # one at a time: at once, three raylets on two loaded cores
            _start_raylet(m, name, cfg.address, token_name)  # missed Ray's 30 s to register
        fleet.ok("pool", "add", "ray", "--address", cfg.address, "--token-file", str(token_file),
                 "--name", "lab", timeout=120)
        fleet.ok("run", "train.py", "--gpu", "H100", "--count", str(2 * PER_NODE), "--nodes", "2",
                 "--spares", "1", "--setup", SETUP, "--name", JOB, "--max-restarts", "1",
                 "--checkpoint-to", str(durable), "-d", "-y",
                 "--", "--steps", "1000000", "--checkpoint-every", "20", *TINY, timeout=180)
        yield state
    finally:
        fleet.cleanup()
        if state.killed:
            m.start(state.killed)  # the machine booted again for the other machine tests
        left = {name: _end_machine(m, name) for name in m.names}
        ray_local.stop(cfg)  # the head's processes by its marker, its temp folder, the token
        for name in m.names:
            m.run(name, f"rm -f /srv/machine/{token_name}", check=False)
        shutil.rmtree(durable, ignore_errors=True)
        state.facts["left"] = left
        assert not any(left.values()), f"processes left on the machines: {left}"
        assert not ray_local.processes(cfg), "the head's Ray processes outlived the test"


def _events(fleet: Fleet) -> list[dict[str, Any]]:
    return list(fleet.status(JOB).get("events", []))


def _held(fleet: Fleet) -> dict[str, str]:
    """The machines the job's cluster runs on: pool node -> address (its spare held too, but
    left out here)."""
    cluster = fleet.status(JOB)["cluster"]
    nodes = fleet.json("pool", "list", "lab", "--json")[0]["nodes"]
    row = next(r for r in fleet.json("list", "--json") if r["for_job"] == JOB)
    return {n["node"]: n["address"] for n in nodes
            if n["held_by"] == [cluster] and n["node"] not in row["spares"]}


def _spare(fleet: Fleet) -> str:
    """The machine the job's cluster holds as its spare (`list`)."""
    rows = fleet.json("list", "--json")
    row = next(r for r in rows if r["for_job"] == JOB)
    assert len(row["spares"]) == 1, row
    return str(row["spares"][0])


def _first_step_after(fleet: Fleet, after: float) -> float | None:
    """When rank 0 first reported a step after `after` (the recorded series, not a poll)."""
    db = sqlite3.connect(f"file:{fleet.home / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        row = db.execute("SELECT min(time) FROM metrics WHERE job = ? AND name = 'step' AND "
                         "rank = 0 AND time > ?", (JOB, after)).fetchone()
    finally:
        db.close()
    return None if row is None or row[0] is None else float(row[0])


def _metric_nodes(fleet: Fleet) -> dict[str, set[str]]:
    """The nodes each of two series came from: device samples, and the ranks' step times."""
    db = sqlite3.connect(f"file:{fleet.home / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        rows = db.execute("SELECT DISTINCT name, node FROM metrics WHERE job = ? AND name IN "
                          "('gpu_utilization', 'step_time_seconds')", (JOB,)).fetchall()
    finally:
        db.close()
    found: dict[str, set[str]] = {}
    for name, node in rows:
        found.setdefault(name, set()).add(node)
    return found


def test_the_pool_is_the_machines_raylets_with_the_token_off_every_command_line(
        rm: RayOnMachines) -> None:
    nodes = {n["node"]: n for n in rm.fleet.json("pool", "list", "lab", "--json")[0]["nodes"]}
    for name in rm.machines.names:
        n = nodes[name]
        assert n["address"] == rm.machines.address(name) and n["health"] == "ok"
        assert (n["gpu"], n["count"], n["simulated"]) == ("H100-SXM", PER_NODE, True)
    assert nodes["submitter"]["count"] == 0  # the head offers nothing
    for name in rm.machines.names:
        lines = _cmdlines(rm.machines, name)
        assert any("raylet" in ln for ln in lines), (name, lines)
        assert not [ln for ln in lines if rm.token in ln], name
        for pid in rm.machines.pids(name):
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{pid}/environ").read_bytes()
                assert rm.token.encode() not in env and b"RAY_AUTH_TOKEN=" not in env, (name, pid)


def test_the_job_runs_the_shipped_workdir_on_two_machines_reporting_here(
        rm: RayOnMachines) -> None:
    """The folder exists only on the submitter; the job log says it was shipped, both held
    machines run the copy under its digest, and rank 0's steps come back to the submitter."""
    fleet = rm.fleet
    fleet.wait_for(JOB, lambda s: any(e.get("kind") == "checkpoint"
                                      for e in s.get("events", [])), timeout=300)
    held = _held(fleet)
    assert len(held) == 2 and set(held) <= set(rm.machines.names), held
    log = (fleet.home / "jobs" / JOB / "job.log").read_text()
    shipped = re.search(r"gpufleet: workdir ([0-9a-f]{12}): .* shipped to head, worker1", log)
    assert shipped, log[-3000:]
    for name in held:
        ran = _script_cwds(rm.machines, name, "train.py")  # 2 workers (and their helpers)
        assert len(ran) >= PER_NODE and all(
            f"/.cache/gpufleet/workdirs/{shipped.group(1)}" in cwd for cwd in ran), (name, ran)
        assert rm.machines.run(name, f"test -e {rm.workdir}", check=False).returncode != 0
    assert re.search(r"^\[head rank0\]:step \d+/1000000 loss", log, re.M), log[-3000:]
    assert "all-reduce check passed (10 == 10)" in log  # 4 ranks over gloo across 2 machines
    assert "step " in (fleet.home / "jobs" / JOB / "logs" / "rank0.log").read_text()
    assert fleet.status(JOB)["step"] >= 20
    assert any(p.name.startswith("step-") for p in rm.durable.iterdir()), "no durable copy"
    # the third machine is the spare, warmed while the run trains: the copy placed, set up
    spare = _spare(fleet)
    assert spare in rm.machines.names and spare not in held, (spare, held)
    address = re.escape(rm.machines.address(spare))
    warm = rf"gpufleet: spare {spare} \({address}\) warm in [\d.]+ s: workdir {shipped.group(1)} "
    deadline = time.monotonic() + 120
    while not re.search(r"gpufleet: spare \S+ \(\S+\) (warm in|not warmed)",
                        log := (fleet.home / "jobs" / JOB / "job.log").read_text()):
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.5)
    assert re.search(warm + "shipped, setup ran", log), log[-3000:]
    held_there = rm.machines.run(spare, "ls -p /root/.cache/gpufleet/workdirs").stdout.split()
    assert any(e.startswith(shipped.group(1)) and e.endswith("/") and ".users" not in e
               for e in held_there), held_there  # the copy, beside its marks
    rm.facts["spare"] = spare
    # the agents' device samples and the ranks' reports reach the submitter's bridge address
    # from both machines, labelled with them
    deadline = time.monotonic() + 60
    while (seen := _metric_nodes(fleet)) != {"gpu_utilization": set(held),
                                             "step_time_seconds": set(held)}:
        assert time.monotonic() < deadline, (seen, held)
        time.sleep(1.0)


def test_a_killed_machine_is_named_and_healed_on_the_third_from_the_durable_copy(
        rm: RayOnMachines) -> None:
    fleet, m = rm.fleet, rm.machines
    plan = json.loads((fleet.home / "jobs" / JOB / "ray-plan.json").read_text())
    worker1 = next(n for n in plan["nodes"] if n["name"] == "worker1")
    victim = worker1["node_id"]
    spare = rm.facts["spare"]
    rm.killed, rm.killed_at = victim, time.time()
    m.kill(victim)
    st = fleet.wait_for(JOB, lambda s: any(e.get("kind") == "resumed" and e["time"] > rm.killed_at
                                           for e in s.get("events", [])), timeout=300)
    events = st["events"]
    failed = next(e for e in events if e["kind"] == "worker_failed" and e["time"] > rm.killed_at)
    assert f"NodeLostError: node worker1 ({m.address(victim)}) left the Ray cluster" \
        in failed["reason"], failed
    replaced = next(e for e in events if e["kind"] == "node_replaced")
    assert re.search(rf"node {victim} lost; replaced by spare node {spare} \(",
                     replaced["reason"]), replaced["reason"]
    reasons = [e["reason"] for e in events]
    assert any(r.startswith("no free node for a new spare") for r in reasons), reasons
    resumed = next(e for e in events if e["kind"] == "resumed" and e["time"] > rm.killed_at)
    first = None
    deadline = time.monotonic() + 120
    while (first := _first_step_after(fleet, resumed["time"])) is None:
        assert time.monotonic() < deadline, "no step reported after the resume"
        time.sleep(0.5)
    rm.facts.update(kill_to_failed_s=failed["time"] - rm.killed_at,
                    kill_to_first_step_s=first - rm.killed_at)
    print(f"\nkill -> run failed {rm.facts['kill_to_failed_s']:.1f} s; kill -> first step after "
          f"the heal {rm.facts['kill_to_first_step_s']:.1f} s")
    assert set(_held(fleet)) == set(m.names) - {victim}  # the survivor and the spare
    log = (fleet.home / "jobs" / JOB / "job.log").read_text()
    starts = re.findall(r"torchrun started on 2 node\(s\): head \(([\d.]+)\), worker1 \(([\d.]+)\)",
                        log)
    assert len(starts) == 2 and starts[1][1] == m.address(spare), starts
    # the spare had the copy and its setup: the second run sends it nothing, sets up nothing
    shipped = re.findall(r"gpufleet: workdir \w+: .* shipped to ([^;\n]+)(?:; already on (\S+) "
                         r"\(not sent\))?$", log, re.M)
    assert [s for s in shipped] == [("head, worker1", ""), ("head", "worker1")], shipped
    assert len(re.findall(r"^\[worker1\]: setup: warming up", log, re.M)) == 1, log[-3000:]
    # the spare had no checkpoint of its own: every rank read the durable copy
    assert re.search(rf"^\[head rank0\]:gpufleet: resumed from {re.escape(str(rm.durable))}/step-",
                     log, re.M), log[-3000:]
    assert fleet.status(JOB)["status"] == "running"


def test_stop_leaves_no_process_of_the_job_on_any_machine(rm: RayOnMachines) -> None:
    fleet, m = rm.fleet, rm.machines
    fleet.ok("stop", JOB, timeout=120)
    st = fleet.wait_ended(JOB, 120)
    assert st["status"] == "stopped", st
    deadline = time.monotonic() + 60
    while (left := {n: _job_pids(m, n, JOB) for n in m.names if n != rm.killed}) \
            and any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(left.values()), f"job processes left on the machines: {left}"
    for name in set(m.names) - {rm.killed}:  # the shipped copies went with the job
        gone = m.run(name, "ls /root/.cache/gpufleet/workdirs 2>/dev/null | wc -l", check=False)
        assert gone.stdout.strip() in ("", "0"), (name, gone.stdout)
