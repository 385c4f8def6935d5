"""A Slurm pool whose nodes are test machines that share nothing with the submitter (issue 29,
item 7): `scripts/test-slurm up DIR 3 --machines MDIR` runs slurmd nK (and a munged of its own)
inside machine mK of `scripts/test-machines`, slurmctld in the root namespace at the
submitter's bridge address.

One job, run from a folder that exists only here (under this test's /tmp, which the machines
do not see), in a private $HOME, on two machines: its workdir travels by sbcast, its steps run
the machines' own node environment (`pool add slurm --python`), its logs and progress come back
here. The third machine is its spare (`--spares 1`: the same Slurm job, `--no-kill`), which
gets the shipped copy while the first run trains. A machine is killed mid-job: the run fails
naming the lost node and heals on the spare, inside the same Slurm job, from `--checkpoint-to`
(a folder outside what the machines hide, as a file system all nodes mount would be); the
heal on a new allocation is test_slurm_pool's. The shipped copy lands in each node's cache
under the node user's own home (not the submitter's $HOME, which srun carries). `stop` then
leaves no process of the job and no shipped file on any machine (the driver's clean-up step
after the run, srun's SIGTERM killing the node's own step before its clean-up, then the step
that drops the job's mark), and the Slurm's `down` no process at all.

The module uses the machines `.ci/run` started ($GPUFLEET_TEST_MACHINES; tests/integration/
machines.py) and starts its own Slurm on them, stopped at the end; a machine it kills is
started again.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import ROOT, WORKERS, Fleet
from machines import Machines, machines_or_skip

SLURM = ROOT / "scripts" / "test-slurm"
BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "sbcast")
UP_TIMEOUT_S = 240  # a wait, never a verdict: the daemons start inside the machines


def _require_slurm() -> None:
    missing = [c for c in BINARIES if shutil.which(c) is None]
    why = ("the test Slurm runs its daemons as root" if os.geteuid() != 0 else
           f"Slurm is not installed (missing {', '.join(missing)})" if missing else None)
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the test Slurm: {why}")
        pytest.skip(why)


def _daemons(state: Path) -> set[int]:
    """The Slurm daemons' pids (slurmd, munged of each machine) that up recorded."""
    found = set()
    for f in (state / "pids").iterdir():
        text = f.read_text().strip()
        if text.isdigit():
            found.add(int(text))
    return found


def _eventually(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[Machines, Path]]:
    """The machines and a Slurm whose three nodes run on them (SLURM_CONF set meanwhile)."""
    machines = machines_or_skip()
    _require_slurm()
    state = Path(tempfile.mkdtemp(dir="/tmp", prefix="gfsm"))
    state.rmdir()
    up = subprocess.run([str(SLURM), "up", str(state), "3", "--machines", str(machines.folder)],
                        capture_output=True, text=True, timeout=UP_TIMEOUT_S)
    assert up.returncode == 0, up.stderr[-4000:]
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(state / "slurm.conf")
    try:
        yield machines, state
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        down = subprocess.run([str(SLURM), "down", str(state)], capture_output=True, text=True,
                              timeout=180)
        assert down.returncode == 0, down.stderr
        assert not state.exists()
        # down ends the daemons by pid; what ends a moment later is waited for, not judged
        _eventually("no process left on the machines after down",
                    lambda: not any(machines.pids(n) for n in machines.names), 60)


def _metric_times(home: Path, job: str, after: float) -> list[float]:
    """When the ranks' steps were recorded after `after` (epoch seconds)."""
    db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute("SELECT time FROM metrics WHERE job = ? AND name = 'step_time_seconds' "
                          "AND rank >= 0 AND time > ? ORDER BY time", (job, after)).fetchall()
    finally:
        db.close()
    return [t for (t,) in rows]


def _shipped(machines: Machines, name: str, cache: str) -> list[str]:
    """What a run's shipping left on the machine: entries of the node's workdir cache, and the
    tar and plan `sbcast` put on its /tmp."""
    listed = machines.run(name, f"ls -A {cache} 2>/dev/null; ls -d /tmp/gpufleet-* 2>/dev/null",
                          check=False)
    return listed.stdout.split()


_FAILS = """import os, sys
if os.environ["RANK"] == "1":
    raise ValueError("broken on purpose " + sys.argv[1])
"""


def test_a_failing_ranks_error_record_comes_back_from_its_machine(
        lab: tuple[Machines, Path], tmp_path: Path) -> None:
    """torchrun writes a rank's error record on its own machine's disk (the job folder is not
    there); the node agent sends it back after the node's last line and the driver writes it
    into the job folder here, so the reason is the record's exception, not the log's tail."""
    machines, state = lab
    token = uuid.uuid4().hex
    project = tmp_path / "project"
    project.mkdir()
    (project / "fails.py").write_text(_FAILS)
    fleet = Fleet(tmp_path / "gfhome", project)
    env = {"HOME": str(tmp_path / "user"), "SLURM_CONF": str(state / "slurm.conf")}
    (tmp_path / "user").mkdir()
    try:
        added = fleet("pool", "add", "slurm", "--python", machines.python("m1"), env=env)
        assert added.returncode == 0, added.stderr
        done = fleet("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "-y", "--name",
                     "f", "fails.py", "--", token, env=env, timeout=300)
        status = fleet.status("f")
        assert done.returncode != 0 and status["status"] == "failed", (done.stdout, done.stderr)
        # from the record: exact, with no log lines (the log-tail form ends "; last lines:")
        assert status["reason"] == (f"rank 1 failed (exit code 1): ValueError: broken on purpose "
                                    f"{token}"), status["reason"]
        records = list((fleet.home / "jobs" / "f" / "torchrun").glob("*/attempt_*/*/error.json"))
        assert [token in f.read_text() for f in records] == [True], records
        log = fleet("logs", "f", env=env).stdout
        assert "shipped to head, worker1" in log and "gpufleet-file" not in log, log
    finally:
        fleet.cleanup()


def test_a_job_from_a_folder_only_here_runs_on_two_machines_and_heals_a_killed_one(
        lab: tuple[Machines, Path], tmp_path: Path) -> None:
    machines, state = lab
    token = uuid.uuid4().hex
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(WORKERS / "travelling_job.py", project / "train_job.py")
    (project / "data.txt").write_text(f"{token}\n")
    fleet = Fleet(tmp_path / "gfhome", project)
    env = {"HOME": str(tmp_path / "user"), "SLURM_CONF": str(state / "slurm.conf")}
    (tmp_path / "user").mkdir()
    durable = Path(tempfile.mkdtemp(dir="/run", prefix="gfck-"))  # not hidden from the machines

    def ok(*args: str, timeout: float = 180) -> str:
        done = fleet(*args, env=env, timeout=timeout)
        assert done.returncode == 0, f"gpufleet {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    node_of = {f"n{k}": f"m{k}" for k in range(1, 4)}
    killed = ""
    try:
        for m in machines.names:  # the job's folder and homes are nowhere on the machines
            seen = machines.run(m, f"ls -d {project} {tmp_path} {fleet.home} {durable}",
                                check=False)
            assert seen.stdout.split() == [str(durable)], (m, seen.stdout, seen.stderr)
        ok("pool", "add", "slurm", "--python", machines.python("m1"))
        ok("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "--spares", "1",
           "--max-restarts", "1", "--checkpoint-to", str(durable), "-y", "-d", "--name", "j",
           "train_job.py", "--", "--steps", "400", "--nap", "0.25")
        fleet.wait_for_step("j", 6, timeout=300)
        cluster = next(c for c in fleet.clusters() if c["job"] == "j")
        first, second = (d.split("/")[0] for d in cluster["devices"])
        third = next(n for n in node_of if n not in (first, second))
        assert cluster["spares"] == [third], cluster
        # the spare holds the copy the first run shipped before any node is lost
        _eventually("the spare warmed", lambda: f"spare {third} warm in " in ok("logs", "j"), 120)
        warm = re.search(rf"spare {third} warm in [\d.]+ s: workdir (\w+) placed",
                         ok("logs", "j"))
        assert warm, ok("logs", "j")
        node_home = machines.run("m1", "getent passwd \"$(id -un)\" | cut -d: -f6").stdout.strip()
        held = machines.run(node_of[third], f"ls {node_home}/.cache/gpufleet/workdirs",
                            check=False).stdout
        assert warm.group(1) in held, held
        killed = node_of[second]
        at_kill = time.time()
        machines.kill(killed)  # every process of that machine at once: its slurmd, its ranks

        def healed(s: dict[str, Any]) -> bool:
            kinds = [e["kind"] for e in s.get("events", [])]
            return "node_replaced" in kinds and s.get("status") == "running" and \
                bool(_metric_times(fleet.home, "j", max(
                    e["time"] for e in s["events"] if e["kind"] == "node_replaced")))

        after = fleet.wait_for("j", healed, timeout=420)
        events = after["events"]
        restarting = next(e for e in events if e["kind"] == "restarting")
        replaced = next(e for e in events if e["kind"] == "node_replaced")
        assert f"node worker1 ({second})" in restarting["reason"], events
        assert "NodeLostError" in restarting["reason"], events
        assert replaced["reason"].startswith(f"node {second} lost; replaced by spare node "
                                             f"{third} "), events
        kept = [e["reason"] for e in events if e["kind"] == "node_replaced"][1]
        assert re.match(r"Slurm job \d+ kept: no new allocation", kept), events
        first_step_again = _metric_times(fleet.home, "j", replaced["time"])[0]
        print(f"\nkill -> run failed: {restarting['time'] - at_kill:.1f} s; "
              f"kill -> first step after the heal: {first_step_again - at_kill:.1f} s; "
              f"the restart: {restarting['reason']}")
        cluster = next(c for c in fleet.clusters() if c["job"] == "j")
        assert {d.split("/")[0] for d in cluster["devices"]} == {first, third}, cluster

        log = ok("logs", "j")
        # both runs shipped the folder (by sbcast) to machines that had not got it: the first
        # to both; the second at least to the new machine (worker1), and to the survivor (head)
        # too unless the survivor's copy was still there when it started
        shipped = re.findall(r"workdir \w+: 2 file\(s\).* shipped to ((?:head, )?worker1)", log)
        assert len(shipped) == 2 and shipped[0] == "head, worker1", log
        # ...and ran it there, in a copy of the nodes' own, with the node environment's Python
        ran = re.findall(rf"rank (\d) on (n\d) runs (\S+) and read {token} with (\S+) and "
                         r"(\S+)", log)
        assert {(r, n) for r, n, *_ in ran} == {("0", first), ("1", second), ("1", third)}, log
        node_env = machines.python("m1").removesuffix("/bin/python")
        # the nodes' cache is under their user's own home, whatever $HOME the submitter has
        cache = f"{node_home}/.cache/gpufleet/workdirs"
        assert node_home and not node_home.startswith(env["HOME"]), node_home
        for _, _, where, python, package in ran:
            assert where.startswith(f"{cache}/"), (cache, ran)
            assert python.startswith(node_env) and package.startswith(node_env), ran
        resumed = re.findall(r"rank 1 on (n\d) resumes at step (\d+)", log)
        assert resumed[0] == (second, "1") and resumed[1][0] == third, resumed
        # the third machine never had a checkpoint of its own: it came from --checkpoint-to
        at = int(resumed[1][1]) - 1
        # the restart names the newest checkpoint copied when it was decided; a copy that was
        # still in flight may land before the new run starts, which then resumes from it
        said = re.search(r"from gpufleet's checkpoint at step (\d+)", restarting["reason"])
        assert said and 0 < int(said.group(1)) <= at, events
        assert any(e["kind"] == "checkpoint_copied" and
                   e["reason"] == f"step {at} copied to {durable}/step-{at:08d}" for e in events)

        ok("stop", "j", timeout=180)
        assert fleet.wait_ended("j", timeout=120)["status"] == "stopped"
        daemons = _daemons(state)
        live = [node_of[first], node_of[third]]
        _eventually("nothing of the job left on the machines",
                    lambda: not any(set(machines.pids(m)) - daemons for m in live), 120)
        # ...and no shipped copy, setup marker, tar or plan: the clean-up step removed them
        # (the first run's lost machine was killed; only its survivor was asked)
        _eventually("no shipped file left on the machines",
                    lambda: not any(_shipped(machines, m, cache) for m in live), 60)
        log = ok("logs", "j")
        cleaned = re.findall(r"workdir \w+ clean-up (?:in [\d.]+s: (.*)|((?:exit|timed out) .*))", log)
        print(f"clean-up steps: {cleaned}")
        # one clean-up a run (the allocation outlived the lost node); the stopped run's leaves
        # the former spare's copy to the job's mark, which the release step then drops
        assert len(cleaned) == 2, log
        assert re.fullmatch(r"head (removed|absent)", cleaned[0][0]) or cleaned[0][1], log
        assert re.fullmatch(r"head (removed|absent), worker1 in use", cleaned[1][0]), log
        released = re.search(r"job j's workdir mark \(nodes and spares\) clean-up in [\d.]+s: "
                             r"(.*)", log)
        assert released and sorted(released.group(1).split(", ")) == sorted(
            [f"{first} nothing marked", f"{third} released"]), log
    finally:
        fleet.cleanup()
        shutil.rmtree(durable, ignore_errors=True)
        if killed:
            machines.start(killed)
