"""Pools on a real Slurm cluster on this machine: one slurmctld and three slurmd (n1..n3) on
127.0.0.1, each node with one declared H100 (`gpu:h100:1`, feature gpufleet-simulated: CPU
workers with gloo), started by `scripts/test-slurm`.

The cluster is the one `.ci/run` (or `scripts/check`) starts, named by $GPUFLEET_TEST_SLURM;
run alone, this module starts its own and stops it at the end. A test that kills a node starts
it again. After every test nothing gpufleet submitted is left in Slurm's queue and no process
of the test's fleet is left (they carry its GPUFLEET_HOME through srun's --export=ALL).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import EXAMPLES, ROOT, WORKERS, Fleet, error_lines
from sqlalchemy import text as sql_text

from gpufleet.store import Store

SCRIPT = ROOT / "scripts" / "test-slurm"
NODES = ("n1", "n2", "n3")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root"
    missing = [c for c in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(c) is None]
    return f"Slurm is not installed (missing {', '.join(missing)})" if missing else None


@pytest.fixture(scope="module")
def slurm() -> Iterator[Path]:
    """The test Slurm's state folder, with $SLURM_CONF pointing at it for the CLI."""
    given = os.environ.get("GPUFLEET_TEST_SLURM")
    own: Path | None = None
    if given:
        state = Path(given)
    else:
        why = _unavailable()
        if why:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI needs the test Slurm: {why}")
            pytest.skip(why)
        own = Path(tempfile.mkdtemp(dir="/tmp", prefix="gfs"))
        up = subprocess.run([str(SCRIPT), "up", str(own)], capture_output=True, text=True,
                            timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        state = own
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(state / "slurm.conf")
    try:
        yield state
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        if own is not None:
            subprocess.run([str(SCRIPT), "down", str(own)], capture_output=True, timeout=120)


def _squeue() -> list[str]:
    """gpufleet's jobs in Slurm's queue: 'ID NAME STATE'."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return [ln for ln in out.splitlines() if " gpufleet-" in ln]


@pytest.fixture
def sfleet(fleet: Fleet, slurm: Path) -> Iterator[Fleet]:
    """A fleet whose default pool is the test Slurm's partition, on idle nodes; afterwards no
    job of it is left in Slurm's queue. Cancelled jobs leave it within seconds, but one whose
    node died stays COMPLETING until Slurm has marked the node down and back (a minute or
    more under load): that is Slurm's clean-up, waited out here, not a job gpufleet left."""
    _wait_idle(90)
    fleet.ok("pool", "add", "slurm")
    yield fleet
    fleet.cleanup()
    deadline = time.monotonic() + 90
    while (left := [j for j in _squeue() if not j.endswith(" COMPLETING")]) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"gpufleet's jobs left in Slurm's queue: {left}"


def _wait_idle(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True,
                                text=True, timeout=30).stdout.split()
        if states and all(s == "idle" for s in states) and not _squeue():
            return
        time.sleep(0.5)
    pytest.fail(f"the test Slurm's nodes are not idle: {states}, queue {_squeue()}")


def _nodes(fleet: Fleet) -> list[dict[str, Any]]:
    listing = fleet.json("pool", "list", "slurm", "--json")
    assert len(listing) == 1 and "nodes" in listing[0], listing
    return listing[0]["nodes"]


def _comment(job_id: str) -> str:
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                           text=True, timeout=30).stdout
    m = re.search(r"Comment=(.*?)(?= \w+=|$)", shown)
    return m.group(1).strip() if m else ""


# ------------------------------------------------------------------------------ the pool itself


def test_pool_list_shows_the_partitions_nodes_from_slurms_node_table(sfleet: Fleet) -> None:
    nodes = _nodes(sfleet)
    assert [n["node"] for n in nodes] == list(NODES)
    for n in nodes:
        assert (n["gpu"], n["count"], n["free"], n["state"], n["health"]) == \
            ("H100-SXM", 1, 1, "idle", "ok"), n
        assert n["simulated"] is True and n["address"] == "127.0.0.1"
    table = sfleet.ok("pool", "list").stdout
    assert "Pool slurm (default): slurm, partition gpu" in table and "STATE" in table


def test_bad_input_and_impossible_requests_are_refused_at_once(sfleet: Fleet) -> None:
    for args, field in ((["pool", "add", "slurm", "--partition", "nope", "--name", "x"],
                         "partition"),
                        (["pool", "add", "slurm", "--address", "h:1", "--name", "y"], "address"),
                        (["pool", "add", "ray", "--partition", "gpu", "--name", "z"],
                         "partition"),
                        (["launch", "--gpu", "H100", "--count", "1", "--time-limit", "0s",
                          "-y"], "time_limit")):
        r = sfleet(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = error_lines(r.stderr)
        assert len(lines) == 1 and f"{field}:" in lines[0], (args, r.stderr)
    # more GPUs than the partition has, a type it lacks: refused before anything is submitted
    for args, want in ((["--gpu", "H100", "--count", "4", "--nodes", "4"], "could never hold"),
                       (["--gpu", "A100", "--count", "1"], "the pool has no A100")):
        r = sfleet("launch", *args, "-y")
        assert r.returncode == 2 and want in r.stderr, (args, r.stdout, r.stderr)
        assert "Slurm job" not in r.stderr  # nothing was submitted
    assert _squeue() == []
    assert [p["pool"] for p in sfleet.json("pool", "list", "--json")] == ["local", "slurm"]


def test_dry_run_prints_the_sbatch_the_srun_steps_and_each_nodes_torchrun(sfleet: Fleet) -> None:
    out = sfleet.ok("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "--time-limit", "10m",
                    "--dry-run", str(EXAMPLES / "gpt.py"), "--", "--steps", "5").stdout
    sbatch = next(ln for ln in out.splitlines() if ln.startswith("sbatch "))
    for part in ("--nodes=2", "--gres=gpu:h100:1", "--exclusive", "--no-requeue",
                 "--partition=gpu", "--time=12", "--job-name=gpufleet-run-"):
        assert part in sbatch, sbatch
    steps = [ln for ln in out.splitlines() if ln.startswith("srun ")]
    assert len(steps) == 2 and all("--overlap" in s for s in steps), out
    assert out.count("-m gpufleet.launch.warm -- --nnodes 2") == 2, out  # torchrun's own, warm
    assert _squeue() == []  # a dry run submits nothing


# ------------------------------------------------------------------------------ allocations


def test_launch_is_one_allocation_a_waiting_one_says_slurms_reason_and_stop_cancels(
        sfleet: Fleet) -> None:
    got = sfleet.ok("launch", "--gpu", "H100", "--count", "2", "--nodes", "2", "--name", "a",
                    "--time-limit", "30m", "-y")
    m = re.search(r"Slurm job (\d+) running on (n\d), (n\d)", got.stderr)
    assert m, got.stderr
    job_id = m.group(1)
    assert _squeue() == [f"{job_id} gpufleet-a RUNNING"]
    assert _comment(job_id) == "gpufleet cluster a"
    held = {n["node"]: n for n in _nodes(sfleet)}
    for name in m.group(2, 3):
        assert (held[name]["free"], held[name]["held_by"], held[name]["state"]) == \
            (0, ["a"], "allocated")
    # a shell step inside the allocation, on the cluster's second node
    shell = sfleet.ok("ssh", "a-worker1", "--", "printenv", "SLURMD_NODENAME", "SLURM_JOB_ID")
    assert shell.stdout.split() == [m.group(3), job_id], shell.stdout
    # a second 2-node cluster cannot start while `a` holds two of the three nodes: it waits in
    # Slurm's queue, says why, shows in `gpufleet jobs`, and Ctrl-C cancels it
    waiting = sfleet.popen("launch", "--gpu", "H100", "--count", "2", "--nodes", "2", "--name",
                           "b", "-y", sigint_default=True, merge_stderr=True)
    seen = ""
    deadline = time.monotonic() + 60
    assert waiting.stdout is not None
    while "pending: Resources" not in seen and time.monotonic() < deadline:
        seen += waiting.stdout.readline()
    assert "pending: Resources" in seen, seen
    listed = sfleet.ok("jobs").stdout
    assert "pending in Slurm" in listed and "Resources" in listed, listed
    waiting.send_signal(signal.SIGINT)
    waiting.wait(timeout=30)
    assert waiting.returncode != 0
    deadline = time.monotonic() + 20
    while len(_squeue()) > 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _squeue() == [f"{job_id} gpufleet-a RUNNING"]
    # SIGTERM (a scheduler's or a shell's kill) cancels a waiting request too
    waiting = sfleet.popen("launch", "--gpu", "H100", "--count", "2", "--nodes", "2", "--name",
                           "c", "-y", merge_stderr=True)
    assert waiting.stdout is not None
    seen = ""
    deadline = time.monotonic() + 60
    while "pending:" not in seen and time.monotonic() < deadline:
        seen += waiting.stdout.readline()
    assert "pending:" in seen, seen
    waiting.terminate()
    waiting.wait(timeout=30)
    deadline = time.monotonic() + 20
    while len(_squeue()) > 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _squeue() == [f"{job_id} gpufleet-a RUNNING"]
    assert [c["name"] for c in sfleet.clusters()] == ["a"]
    sfleet.ok("stop", "a", "-y")
    deadline = time.monotonic() + 20
    while _squeue() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _squeue() == []
    assert all(n["free"] == 1 for n in _nodes(sfleet))


# ------------------------------------------------------------------------------ jobs


def test_two_node_gpt_recovers_from_a_killed_slurmd_with_a_new_allocation(
        sfleet: Fleet, slurm: Path) -> None:
    """A 2-node x 1-GPU DDP run of the example GPT (all-reduce checked, loss falling); its
    second node's slurmd and steps are killed mid-job: every node's run ends, the job is
    restarted from its last checkpoint on a new allocation without the dead node."""
    # the example, held at step 13 in its first run until the kill ends it (held_gpt.py); the
    # kill after the first checkpoint is recorded, so the restart has one to resume from
    sfleet.ok("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "--max-restarts", "1",
              "-y", "-d", "--name", "g", str(WORKERS / "held_gpt.py"), "--", "--hold-at", "13",
              "--steps", "30", "--checkpoint-every", "6", timeout=120)
    sfleet.wait_for("g", lambda s: any(e["kind"] == "checkpoint" for e in s.get("events", [])),
                    timeout=240)
    cluster = next(c for c in sfleet.clusters() if c["job"] == "g")
    first, second = (d.split("/")[0] for d in cluster["devices"])
    killed = subprocess.run([str(SCRIPT), "kill-node", str(slurm), second], capture_output=True,
                            text=True, timeout=60)
    assert killed.returncode == 0, killed.stderr
    try:
        final = sfleet.wait_ended("g", timeout=360)
    finally:
        back = subprocess.run([str(SCRIPT), "start-node", str(slurm), second],
                              capture_output=True, text=True, timeout=120)
        assert back.returncode == 0, back.stderr
    assert final["status"] == "succeeded", [(e["kind"], e["reason"]) for e in final["events"]]
    events = {e["kind"]: e["reason"] for e in final["events"]}
    assert f"NodeLostError: node worker1 ({second})" in events["restarting"], events
    assert "from gpufleet's checkpoint at step " in events["restarting"], events
    replaced = events["node_replaced"]
    assert f"node(s) {second} lost" in replaced and "new allocation: Slurm job" in replaced
    assert second not in replaced.split("new allocation")[1], replaced
    log = sfleet.ok("logs", "g").stdout
    assert "all-reduce check passed" in log and re.search(r"\[(head|worker1) rank0\]:", log)
    assert re.search(r"torchrun starting on 2 node\(s\) of Slurm job \d+: head \(n\d\), "
                     r"worker1 \(n\d\)", log), log
    assert final["loss"] < final["first_loss"], final
    assert first in replaced.split("new allocation")[1], replaced  # the survivor is kept
    # each rank's metrics are labelled with the Slurm node it ran on (as `pool list` names it),
    # not "local": both of the first allocation's, then the survivor and its new partner
    store = Store(url=f"sqlite:///{sfleet.home / 'state.db'}")
    with store.read() as s:
        ranks = {n for (n,) in s.execute(sql_text(
            "select distinct node from metrics where job='g' and name='step_time_seconds' "
            "and rank >= 0"))}
    store.close()
    assert {first, second} < ranks <= set(NODES), ranks


def test_a_lost_node_is_replaced_by_a_spare_of_the_same_allocation(
        sfleet: Fleet, slurm: Path) -> None:
    """`--spares 1`: one Slurm job of 3 nodes (--no-kill), 2 of them the cluster's and the
    third its spare, listed and billed; the spare is warmed while the first run trains (the
    setup once, marked with the job); a node killed mid-job is replaced by the spare inside
    the same Slurm job (no new sbatch, nothing queued), whose run needs no setup again; after
    the job, nothing is left in the nodes' cache."""
    sfleet.ok("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "--spares", "1",
              "--max-restarts", "1", "--setup", "echo warming $SLURMD_NODENAME", "-y", "-d",
              "--name", "s", str(WORKERS / "held_gpt.py"), "--", "--hold-at", "13", "--steps",
              "30", "--checkpoint-every", "6", timeout=120)
    sfleet.wait_for("s", lambda s: any(e["kind"] == "checkpoint" for e in s.get("events", [])),
                    timeout=240)
    cluster = next(c for c in sfleet.clusters() if c["job"] == "s")
    own = [d.split("/")[0] for d in cluster["devices"]]
    assert len(own) == 2 and len(cluster["spares"]) == 1, cluster
    spare = cluster["spares"][0]
    assert sorted([*own, spare]) == list(NODES)
    queued = _squeue()
    assert len(queued) == 1 and queued[0].endswith(" RUNNING"), queued
    slurm_job = queued[0].split()[0]
    # warmed while the first run trains (held at step 13): its line says where and what
    deadline = time.monotonic() + 120
    while f"spare {spare} warm in " not in (log := sfleet.ok("logs", "s").stdout) and \
            time.monotonic() < deadline:
        time.sleep(1)
    assert re.search(rf"spare {spare} warm in [\d.]+ s: workdir {re.escape(str(sfleet.cwd))} "
                     r"seen here, setup (ran|done before)", log), log
    killed = subprocess.run([str(SCRIPT), "kill-node", str(slurm), own[1]], capture_output=True,
                            text=True, timeout=60)
    assert killed.returncode == 0, killed.stderr
    try:
        final = sfleet.wait_ended("s", timeout=360)
    finally:
        back = subprocess.run([str(SCRIPT), "start-node", str(slurm), own[1]],
                              capture_output=True, text=True, timeout=120)
        assert back.returncode == 0, back.stderr
    log = sfleet.ok("logs", "s").stdout
    assert final["status"] == "succeeded", ([(e["kind"], e["reason"]) for e in final["events"]],
                                            log[-3000:])
    replaced = [e["reason"] for e in final["events"] if e["kind"] == "node_replaced"]
    assert replaced[0] == f"node {own[1]} lost; replaced by spare node {spare} (127.0.0.1)"
    assert replaced[1].startswith(f"Slurm job {slurm_job} kept: no new allocation"), replaced
    runs = re.findall(r"torchrun starting on 2 node\(s\) of Slurm job (\d+): head \((n\d)\), "
                      r"worker1 \((n\d)\)", log)
    assert runs == [(slurm_job, own[0], own[1]), (slurm_job, own[0], spare)], runs
    # the setup ran once in the whole job (the nodes share this machine's cache here; the
    # spare's mark kept its marker past the first run's clean-up): none in the second run
    second = log.split("----- gpufleet: restart 1:")[1]
    assert "setup: warming" not in second, second[:2000]
    assert final["loss"] < final["first_loss"], final
    assert re.search(r"job s's workdir mark \(nodes and spares\) clean-up in [\d.]+s: ", log), \
        log[-2000:]
    cache = Path(os.path.expanduser("~root")) / ".cache" / "gpufleet" / "workdirs"
    left = [p.name for p in cache.glob("*.users/s")] if cache.is_dir() else []
    assert left == [], left


def test_a_failure_that_loses_no_node_restarts_in_the_same_allocation(sfleet: Fleet) -> None:
    """Every restart of a multi-node job asks whether to heal; with no node lost and the
    allocation still running, the next run uses the same Slurm job (no new sbatch)."""
    sfleet.ok("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "--max-restarts", "1",
              "--setup", "echo setup ran in $(pwd)", "-y", "-d", "--name", "f",
              str(WORKERS / "fails_once.py"), timeout=120)
    final = sfleet.wait_ended("f", timeout=240)
    assert final["status"] == "succeeded", final
    kinds = [e["kind"] for e in final["events"]]
    assert "restarting" in kinds and "node_replaced" not in kinds, final["events"]
    log = sfleet.ok("logs", "f").stdout
    jobs = re.findall(r"torchrun starting on 2 node\(s\) of Slurm job (\d+)", log)
    assert len(jobs) == 2 and jobs[0] == jobs[1], log
    assert "failing at step 3 as asked" in log and log.count("done") >= 2, log
    # the test Slurm's nodes see this machine's files: detected by a probe step before each
    # run (and at submission, or --max-restarts without --checkpoint-to would be refused),
    # so nothing was shipped
    assert log.count(f"workdir: every node sees {sfleet.cwd}; nothing shipped") == 2, log
    assert "shipped to" not in log and "WorkdirError" not in log, log
    # setup ran in the shared workdir once per run: its two "nodes" share this machine's
    # cache (one marker per digest), and each run's end removed it (no --keep-workdir)
    assert log.count(f"setup: setup ran in {sfleet.cwd}") == 2, log


def test_a_warm_job_forks_its_ranks_on_every_node_and_again_after_a_restart(
        sfleet: Fleet) -> None:
    """`--warm` on two Slurm nodes: each node's step runs gpufleet's warm launcher, whose
    ranks fork from a forkserver with torch imported, in the first run and in the run after
    a rank's failure, which restarts inside the running launchers: the decision reaches each
    step on its stdin (backends/node_restart.py), and no step is started again."""
    sfleet.ok("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "--max-restarts", "1",
              "--warm", "-y", "-d", "--name", "w", str(WORKERS / "warm_probe.py"), "--",
              "--fail-first-run", "4", timeout=120)
    final = sfleet.wait_ended("w", timeout=300)
    log = sfleet.ok("logs", "w").stdout
    assert final["status"] == "succeeded", (final["events"], log[-3000:])
    found = re.findall(r"\[(head|worker1) rank\d\]:probe rank (\d) warm=(\w+) name=__main__ "
                       r"argv=\['\S+', '4'\] path0=\S+ forkserver_parent=(\w+) frozen=\d+ "
                       r"run=(\d)", log)
    assert sorted((node, rank, run) for node, rank, _, _, run in found) == [
        ("head", "0", "1"), ("head", "0", "2"), ("worker1", "1", "1"), ("worker1", "1", "2")], log
    assert {(warm, forked) for _, _, warm, forked, _ in found} == {("True", "True")}, found
    assert "probe rank 1 failing in the first run as asked" in log
    assert "warm start off" not in log
    assert len(re.findall(r"\[(head|worker1)\]: gpufleet: run 2: the workers restart inside "
                          r"the running launcher", log)) == 2, log[-3000:]
    assert log.count("torchrun starting on 2 node(s)") == 1, log[-3000:]
    restarting = next(e["reason"] for e in final["events"] if e["kind"] == "restarting")
    assert "rank 1 failed (exit code 1)" in restarting, final["events"]
    # the successful run's end: the head's launcher, which hosts the rendezvous store, waits
    # for the other node's agent to close the rendezvous (launch/store_peers.py)
    assert "failed to shutdown the rendezvous" not in log.split("restart 1:")[-1], log[-3000:]


def test_stopping_a_running_job_ends_every_nodes_step_and_cancels_its_allocation(
        sfleet: Fleet) -> None:
    sfleet.ok("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "-y", "-d", "--name", "n",
              str(WORKERS / "napper.py"), timeout=120)
    sfleet.wait_for_step("n", 3, timeout=120)
    assert len(_squeue()) == 1
    sfleet.ok("stop", "n", timeout=90)
    final = sfleet.wait_ended("n", timeout=60)
    assert final["status"] == "stopped", final
    deadline = time.monotonic() + 20
    while _squeue() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _squeue() == []  # the cluster made for the job went with it: scancel
    assert all(n["free"] == 1 for n in _nodes(sfleet))
