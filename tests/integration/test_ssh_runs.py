"""Jobs on an SSH pool of the test machines (tests/integration/machines.py: they share nothing
with the submitter but a link), through the real CLI.

One pool of the three machines for the module, added from $GPUFLEET_TEST_HOSTFILE; each job is
run once and judged by several tests. The job's folder exists only here (under /tmp, which the
machines do not see), $HOME is private, and the script is an ordinary DDP script that knows
nothing of gpufleet. The machines are shared with the other modules on them: what this module
kills or cuts it starts or mends in a `finally`, and its end checks that every machine answers
and that nothing of ours is left on it (no process, no workdir or job folder in its cache).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from fleet_helpers import WORKERS
from ssh_pool_lab import (
    GATE,
    RUN_TIMEOUT,
    Lab,
    Pool,
    processes,
    said,
    ssh_pool,
)

from gpufleet.launch.warm_restart import parked_code
from gpufleet.reportauth import KEY_ENV


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    yield from ssh_pool(tmp_path_factory)


def _driver_key(lab: Lab) -> str:
    return str(_driver(lab).environ()[KEY_ENV])


# ---------------------------------- a job on two machines, one killed mid-job, healed on the third


@dataclass
class Healed:
    """What the job `heal` showed: a run on two machines held after step 1, one machine killed,
    the next run on the survivor and the third machine, let go to the end."""

    code: int
    status: dict[str, Any]
    first: list[str]  # the machines of each run, by name
    second: list[str]
    victim: str
    named_after_s: float  # from the kill to the NodeLostError line in the job's log
    lost_line: str
    key_in_workers: bool  # the report key reached the workers' environment on the machines
    key_on_command_lines: list[str]
    left: dict[str, list[str]]


@pytest.fixture(scope="module")
def healed(pool: Pool) -> Healed:
    pool.gates(open_=False)
    job = pool.lab.popen("run", "--gpu", "cpu", "--count", "4", "--nodes", "2", "--name",
                         "heal", "-y", "--max-restarts", "1", "--checkpoint-to",
                         str(pool.durable / "heal"), "train.py", "--", "--max_steps", "3",
                         "--gate", GATE)
    victim = ""
    try:
        pool.lab.wait_for_step("heal", 1, timeout=RUN_TIMEOUT)
        first = pool.plan("heal")
        used = [pool.name(n["address"]) for n in first["nodes"]]
        key = _driver_key(pool.lab)
        procs = [p for name in used for p in processes(pool.hosts, name)]
        victim = used[1]
        t0 = time.monotonic()
        pool.hosts.kill(victim)
        while "NodeLostError" not in pool.log("heal") and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        took = time.monotonic() - t0
        lost = next((ln for ln in pool.log("heal").splitlines() if "NodeLostError" in ln), "")
        second = pool.second_run("heal")
        pool.gates(open_=True)
        code = job.wait(timeout=RUN_TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
        if victim:
            pool.hosts.start(victim)  # back for the next tests (a reboot: nothing of ours there)
    return Healed(code, pool.lab.status("heal"), used, second, victim, took, lost,
                  any(key in env for _, env in procs),
                  [cmd for cmd, _ in procs if key in cmd], pool.wait_clean())


def test_a_job_from_a_folder_only_here_runs_on_two_machines(pool: Pool, healed: Healed) -> None:
    status = healed.status
    assert healed.code == 0, status
    assert (status["status"], status["step"], status["world_size"]) == ("succeeded", 3, 4), status
    assert len(set(healed.first)) == len(set(healed.second)) == 2
    logs = pool.lab.home / "jobs" / "heal" / "logs"
    assert "step 3: loss" in (logs / "rank0.log").read_text()
    for rank in range(4):
        assert (logs / f"rank{rank}.log").stat().st_size > 0, rank


def test_the_ranks_files_come_back_into_the_job_folder(pool: Pool, healed: Healed) -> None:
    """torchrun's per-rank files, written on the machines, are in the submitter's job folder."""
    back = sorted((pool.lab.home / "jobs" / "heal" / "torchrun").glob("heal-2_*/attempt_0/*/"
                                                                      "stdout.log"))
    assert len(back) == 4, back  # 2 local ranks on each of 2 machines
    assert len({f.parents[2] for f in back}) == 2  # one torchrun log folder per machine
    assert any("step 3: loss" in f.read_text() for f in back)


def test_the_workdir_goes_only_where_it_is_missing_and_is_removed_after(
        pool: Pool, healed: Healed) -> None:
    shipped = re.findall(r"workdir \w+: (\d+) bytes shipped to \S+ \((169\.254\.[\d.]+)\)",
                         pool.log("heal"))
    first, second = shipped[:2], shipped[2:]
    assert sorted(pool.name(a) for _, a in first) == sorted(healed.first), shipped
    assert all(int(n) > 0 for n, _ in first), shipped
    # the survivor has it already; the third machine (and the rebooted one) gets it
    assert {pool.name(a): int(n) > 0 for n, a in second} == \
        {name: name != healed.first[0] for name in healed.second}, shipped
    assert healed.left == {}, "processes or copies left on the machines"


def test_no_command_line_on_a_machine_shows_the_jobs_key(healed: Healed) -> None:
    assert healed.key_in_workers, "the key reached the workers (through stdin, not argv)"
    assert healed.key_on_command_lines == []


def test_a_killed_machine_is_named_within_10_s_and_the_job_heals_on_the_third(
        pool: Pool, healed: Healed) -> None:
    assert healed.named_after_s < 10, f"the lost machine was named after {healed.named_after_s} s"
    victim = pool.hosts.address(healed.victim)
    assert victim in healed.lost_line, healed.lost_line
    assert sorted(healed.second) == sorted(set(pool.hosts.names) - {healed.victim})
    assert any(f"node {victim} lost; replaced by node" in e["reason"]
               for e in healed.status["events"]), healed.status["events"]


def test_the_machines_see_none_of_the_submitters_files(pool: Pool) -> None:
    """shipping.SharesFiles for SSH: `cat` over ssh reads the probe file on no machine; a file
    the machines do share (a folder under /run) is seen."""
    from gpufleet.backends.ssh_plan import sees

    engine = pool.engine()
    ids = [pool.hosts.address(n) for n in pool.hosts.names]
    probe = pool.project / "probe.txt"
    probe.write_text("only here")
    try:
        assert sees(engine, ids, probe, "only here") == dict.fromkeys(ids, False)
        shared = pool.durable / "probe.txt"
        shared.write_text("on every machine")
        assert sees(engine, ids, shared, "on every machine") == dict.fromkeys(ids, True)
        assert sees(engine, ids, shared, "other content") == dict.fromkeys(ids, False)
    finally:
        probe.unlink()  # the workdir's digest stays the one the jobs shipped


# ----------------------- a job that fails the same way three times; its setup runs once a node

SETUP = "echo set up on $(hostname)"


@pytest.fixture(scope="module")
def boom(pool: Pool) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    r = pool.lab("run", "--gpu", "cpu", "--count", "4", "--nodes", "2", "--name", "boom", "-y",
                 "--max-restarts", "3", "--checkpoint-to", str(pool.durable / "boom"),
                 "--setup", SETUP, "train.py", "--", "--max_steps", "6", "--fail-at", "2",
                 "--fail-rank", "3", timeout=RUN_TIMEOUT)
    return r, pool.lab.status("boom")


def test_a_failing_ranks_error_record_comes_back(pool: Pool, boom: Any) -> None:
    r, status = boom
    assert r.returncode != 0 and status["status"] == "failed", said(r)
    # the third identical failure ends the job before its last restart (restarts.decide)
    assert re.match(r"failed 3 times in a row the same way, .*: rank 3 failed \(exit code 1\): "
                    r"RuntimeError: boom at step 2 on rank 3", status["reason"]), status["reason"]
    records = list((pool.lab.home / "jobs" / "boom" / "torchrun").glob("*/attempt_*/*/error.json"))
    assert any("boom at step 2 on rank 3" in f.read_text() for f in records), records


def test_the_restart_keeps_each_machines_launcher_and_ships_and_sets_up_nothing(
        pool: Pool, boom: Any) -> None:
    """Warm workers restart in place on both machines (backends/node_restart.py): one driver,
    one launcher per machine, the supervisor told once per run that every node waits; the
    workdir shipped and set up once; the job given up before its last restart lets the copies
    go (the end order says the job is over)."""
    log = pool.log("boom")
    shipped = re.findall(r"workdir \w+: (\d+) bytes shipped to (\w+)", log)
    assert sorted(n for _, n in shipped) == ["head", "worker1"], shipped  # the first run only
    assert all(int(n) > 0 for n, _ in shipped)
    assert log.count("torchrun starting on 2 host(s)") == 1, log[-3000:]
    for run in (2, 3):
        assert log.count(f"run {run}: the workers restart inside the running launcher") == 2
    assert len(re.findall(r"this node's workers ended \(exit code 1, run [123]\)", log)) == 6
    runs = [parked_code(ln) for ln in log.splitlines() if parked_code(ln) is not None]
    assert runs == [1, 1, 1], log[-3000:]  # one line per run, once every node waited
    ran = re.findall(r"setup: set up on (m\d)", log)
    assert sorted(ran) == sorted(set(ran)) and len(ran) == 2, log[-3000:]
    assert pool.wait_clean() == {}  # the job's end removed the copies and setup marks


def test_a_failing_setup_is_the_jobs_reason_naming_the_node(pool: Pool) -> None:
    r = pool.lab("run", "--gpu", "cpu", "--count", "2", "--nodes", "1", "--name", "nosetup",
                 "-y", "--setup", "echo missing libfoo >&2; exit 3", "train.py", "--",
                 "--max_steps", "1", timeout=RUN_TIMEOUT)
    status = pool.lab.status("nosetup")
    [node] = pool.plan("nosetup")["nodes"]
    assert r.returncode != 0 and status["status"] == "failed", said(r)
    assert re.search(rf"setup failed on \S+ \({re.escape(node['address'])}\) \(exit 3\): "
                     r"missing libfoo", status["reason"].splitlines()[0]), status["reason"]
    assert not status.get("step"), status  # no worker ran a step
    assert pool.wait_clean() == {}


def test_a_node_with_another_gpufleet_is_refused_before_any_worker_starts(
        pool: Pool, tmp_path: Path) -> None:
    """A machine whose gpufleet says another version (its own copy, altered; restored after):
    the run is refused with one line naming the node and both versions, and nothing starts."""
    m, name = pool.hosts, pool.hosts.names[-1]
    [line] = [ln for ln in m.hostfile.read_text().splitlines()
              if ln.split()[:1] == [m.address(name)]]
    (tmp_path / "hostfile").write_text(line + "\n")
    pool.lab.ok("pool", "add", "ssh", "--name", "old", "--hostfile", str(tmp_path / "hostfile"),
                "--no-default")
    init = m.run(name, [m.python(name), "-c", "import gpufleet; print(gpufleet.__file__)"]
                 ).stdout.strip()
    m.run(name, f"cp -p {init} {init}.orig && sed -i 's/^__version__ = .*/__version__ = "
                '"0.0.1.test"/\' ' + init)
    try:
        r = pool.lab("run", "--pool", "old", "--gpu", "cpu", "--count", "2", "--nodes", "1",
                     "--name", "old", "-y", "train.py", "--", "--max_steps", "1",
                     timeout=RUN_TIMEOUT)
    finally:
        m.run(name, f"mv -f {init}.orig {init}")
    status = pool.lab.status("old")
    assert r.returncode != 0 and status["status"] == "failed", said(r)
    import gpufleet

    said_once = [ln for ln in pool.log("old").splitlines() if "versions differ" in ln]
    assert len(said_once) == 1, said_once  # one line, and the reason's first line has it
    assert re.search(rf"gpufleet versions differ: node \S+ \({re.escape(m.address(name))}\) "
                     rf"has 0\.0\.1\.test \(\S+\), this machine {re.escape(gpufleet.__version__)}",
                     status["reason"].splitlines()[0]), status["reason"]
    assert "torchrun starting" not in pool.log("old")
    folder = pool.lab.home / "jobs" / "old"
    assert [f.stat().st_size for f in folder.glob("logs/rank*.log")] == [0, 0]  # nothing ran
    assert not (folder / "torchrun").exists() and not status.get("step"), status
    assert pool.wait_clean() == {}
    pool.lab.ok("pool", "remove", "old")


# --------------------------------------- stop, a killed driver and a cut link: three jobs at once


def _driver(lab: Lab, job: str | None = None) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "gpufleet.backends.ssh_run" in cmd and (job is None or f"/jobs/{job}/" in cmd) \
                    and proc.environ().get("GPUFLEET_HOME") == str(lab.home):
                return proc
        except psutil.Error:
            continue
    raise AssertionError(f"no driver of this fleet is running (job {job})")


@dataclass
class Ended:
    """Three one-machine jobs held after step 1, each on a machine of its own, ended three ways:
    `stop`; a SIGKILLed driver (its ssh connections stay open: the machine must end its workers
    on its own); a cut link (a partition: the driver names the machine, which still runs, hears
    nothing more and ends the job's processes itself)."""

    on: dict[str, str]  # job -> the machine it ran on
    were_there: dict[str, bool]  # job -> its processes or copies were on its machine at step 1
    cut_named_after_s: float  # from the cut to the NodeLostError line in the job's log
    cut_lost_line: str
    cut_code: int  # the cut job's `run` exit code
    cut_workers_left: list[str]  # torch processes on the cut-off machine, still cut off, after
    left: dict[str, list[str]]  # everything of ours on any machine, after the link is mended


@pytest.fixture(scope="module")
def ended(pool: Pool) -> Ended:
    pool.gates(open_=False)
    jobs = {name: pool.lab.popen("run", "--gpu", "cpu", "--count", "2", "--nodes", "1",
                                 "--name", name, "-y", "train.py", "--", "--max_steps", "3",
                                 "--gate", GATE) for name in ("held", "orphan", "cut")}
    cut = ""
    try:
        for name in jobs:
            pool.lab.wait_for_step(name, 1, timeout=RUN_TIMEOUT)
        on = {name: pool.name(pool.plan(name)["nodes"][0]["address"]) for name in jobs}
        left = pool.leftovers()
        there = {name: bool(left[machine]) for name, machine in on.items()}
        cut = on["cut"]
        t0 = time.monotonic()
        pool.hosts.cut(cut)
        while "NodeLostError" not in pool.log("cut") and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        took = time.monotonic() - t0
        lost = next((ln for ln in pool.log("cut").splitlines() if "NodeLostError" in ln), "")
        _driver(pool.lab, "orphan").kill()
        pool.lab.ok("stop", pool.lab.status("held")["cluster"])
        codes = {name: job.wait(timeout=RUN_TIMEOUT) for name, job in jobs.items()}
        # still cut off: its workers end by themselves (no word from the driver for 20 s)
        deadline = time.monotonic() + 120
        while (workers := [c for c, _ in processes(pool.hosts, cut) if "torch" in c]) and \
                time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        if cut:
            pool.hosts.mend(cut)
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
    return Ended(on, there, took, lost, codes["cut"], workers, pool.wait_clean())


def test_three_jobs_at_once_run_on_a_machine_each(ended: Ended) -> None:
    assert sorted(ended.on.values()) == ["m1", "m2", "m3"], ended.on
    assert ended.were_there == {"held": True, "orphan": True, "cut": True}


def test_a_cut_link_is_named_and_the_cut_off_machine_ends_its_workers_itself(
        pool: Pool, ended: Ended) -> None:
    assert ended.cut_named_after_s < 10, f"named after {ended.cut_named_after_s:.1f} s"
    assert pool.hosts.address(ended.on["cut"]) in ended.cut_lost_line, ended.cut_lost_line
    assert ended.cut_code != 0
    assert ended.cut_workers_left == []


def test_after_stop_a_killed_driver_or_a_cut_nothing_is_left_on_any_machine(
        pool: Pool, ended: Ended) -> None:
    assert pool.lab.status("held")["status"] == "stopped"
    assert ended.left == {}


def test_warm_workers_fork_from_each_machines_own_torch(pool: Pool) -> None:
    """`--warm` on two machines: each node's launcher (`python -m gpufleet.launch.warm`, from
    the machine's own gpufleet) forks its rank from a forkserver with torch imported. Last in
    the module: its script changes the shipped workdir."""
    shutil.copy(WORKERS / "warm_probe.py", pool.project / "warm_probe.py")
    r = pool.lab("run", "--gpu", "cpu", "--count", "2", "--nodes", "2", "--name", "warm", "-y",
                 "--warm", "warm_probe.py", "--", "4", timeout=420)
    assert r.returncode == 0, said(r)
    log = pool.lab.ok("logs", "warm").stdout
    found = re.findall(r"probe rank (\d) warm=(\w+) name=__main__ argv=\['(\S+)', '4'\] "
                       r"path0=(\S+) forkserver_parent=(\w+)", log)
    assert sorted(f[0] for f in found) == ["0", "1"], log[-3000:]
    for _rank, warm, script, path0, forked in found:
        assert (warm, forked, script) == ("True", "True", "warm_probe.py")  # as given
        assert path0.startswith("/")  # the script's folder on the machine, as `python` sets it
    assert all("gpufleet.launch.warm" in n["argv"] for n in pool.plan("warm")["nodes"])
    assert pool.lab.status("warm")["step"] == 4
