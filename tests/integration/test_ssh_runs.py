"""Jobs on an SSH pool of hosts that share nothing with the submitter (tests/integration/
ssh_hosts.py: network + mount namespaces, an sshd each, their own Python), through the real CLI.

One pool of three hosts for the module; each job is run once and judged by several tests. The
job's folder exists only here (under /tmp, which the hosts do not see), $HOME is private, and
the script is an ordinary DDP script that knows nothing of gpufleet, run as 2 hosts x 2 CPU
workers.
"""

from __future__ import annotations

import json
import os
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
import ssh_hosts
from fleet_helpers import WORKERS, Fleet

from gpufleet.reportauth import KEY_ENV

RUN_TIMEOUT = 300
GATE = "/root/gpufleet-test-gate"  # on each host: the script's ranks wait after step 1 until it exists


class Lab(Fleet):
    """The CLI with a private $HOME, in a folder that exists only on the submitter."""

    def env(self, slots: int | None = None, **extra: str) -> dict[str, str]:
        return {**super().env(slots, **extra), "HOME": str(self.home.parent / "user")}


@dataclass
class Pool:
    hosts: ssh_hosts.Hosts
    lab: Lab
    project: Path
    durable: Path  # a folder all hosts see, for --checkpoint-to

    def index(self, address: str) -> int:
        return int(address.rsplit(".", 1)[1]) - 10

    def plan(self, job: str) -> dict[str, Any]:
        return json.loads((self.lab.home / "jobs" / job / "ssh-plan.json").read_text())

    def log(self, job: str) -> str:
        return (self.lab.home / "jobs" / job / "logs" / "agent.log").read_text(errors="replace")

    def leftovers(self) -> dict[int, list[str]]:
        """Per host, its processes of gpufleet or torch, and the job folders and workdir copies
        left in its cache."""
        out = {}
        for k in range(1, self.hosts.count + 1):
            if not self.hosts.pids(k):
                continue  # a killed host
            left = [cmd for cmd, _ in processes(self.hosts, k)
                    if "gpufleet" in cmd or "torch" in cmd]
            for sub in ("workdirs", "jobs"):
                r = self.hosts.run(k, f"ls -A ~/.cache/gpufleet/{sub} 2>/dev/null")
                left += [f"{sub}/{name}" for name in r.stdout.split()]
            out[k] = left
        return out

    def wait_clean(self, timeout: float = 60.0) -> dict[int, list[str]]:
        deadline = time.monotonic() + timeout
        while (left := self.leftovers()) and any(left.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return {k: v for k, v in left.items() if v}

    def engine(self) -> Any:
        """The pool's engine as gpufleet builds it from the stored pool."""
        from gpufleet.backends.ssh import SshBackend
        from gpufleet.backends.ssh_conn import Host, parse_hostfile

        hosts = parse_hostfile(self.hosts.hostfile(), Host(address="defaults"))
        return SshBackend("lab", hosts, self.hosts.known_hosts)

    def open_gates(self) -> None:
        for k in range(1, self.hosts.count + 1):
            if self.hosts.pids(k):
                self.hosts.run(k, f"touch {GATE}")

    def close_gates(self) -> None:
        for k in range(1, self.hosts.count + 1):
            if self.hosts.pids(k):
                self.hosts.run(k, f"rm -f {GATE}")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    why = ssh_hosts.can_run()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the SSH test hosts: {why}")
        pytest.skip(why)
    hosts = ssh_hosts.hosts_up(3)
    tmp = tmp_path_factory.mktemp("sshruns")
    durable = Path(hosts.root) / "durable"  # /var/tmp: seen by every host, as a shared disk
    durable.mkdir()
    try:
        (tmp / "user").mkdir()
        project = tmp / "project"
        project.mkdir()
        shutil.copy(WORKERS / "plain_ddp.py", project / "train.py")
        (tmp / "hostfile").write_text(hosts.hostfile())
        lab = Lab(tmp / "home", project, slots=2)
        lab.ok("pool", "add", "ssh", "--name", "lab", "--hostfile", str(tmp / "hostfile"))
        yield Pool(hosts, lab, project, durable)
        left = lab.cleanup()
        assert not left, f"processes left behind on the submitter: {left}"
    finally:
        hosts.down()


def said(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def _driver_key(lab: Lab) -> str:
    return str(_driver(lab).environ()[KEY_ENV])


def processes(hosts: ssh_hosts.Hosts, k: int) -> list[tuple[str, str]]:
    """(command line, environment) of every process in host k (the hosts share this machine's
    process table, so they are read here, by the pids in the host's network namespace)."""
    out = []
    for pid in hosts.pids(k):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        out.append((cmd, env))
    return out


# -------------------------------------- a job on two hosts, one killed mid-job, healed on the third


@dataclass
class Healed:
    """What the job `heal` showed: a run on two hosts held after step 1, one host killed, the
    next run on the survivor and the third host, let go to the end."""

    code: int
    status: dict[str, Any]
    first: list[int]  # the hosts of each run, by index
    second: list[int]
    victim: int
    named_after_s: float  # from the kill to the NodeLostError line in the job's log
    lost_line: str
    key_in_workers: bool  # the report key reached the workers' environment on the hosts
    key_on_command_lines: list[str]
    left: dict[int, list[str]]


@pytest.fixture(scope="module")
def healed(pool: Pool) -> Healed:
    pool.close_gates()
    job = pool.lab.popen("run", "--gpu", "cpu", "--count", "4", "--nodes", "2", "--name",
                         "heal", "-y", "--max-restarts", "1", "--checkpoint-to",
                         str(pool.durable / "heal"), "train.py", "--", "--max_steps", "3",
                         "--gate", GATE)
    try:
        pool.lab.wait_for_step("heal", 1, timeout=RUN_TIMEOUT)
        first = pool.plan("heal")
        used = [pool.index(n["address"]) for n in first["nodes"]]
        key = _driver_key(pool.lab)
        procs = [p for k in used for p in processes(pool.hosts, k)]
        victim = used[1]
        t0 = time.monotonic()
        pool.hosts.kill(victim)
        while "NodeLostError" not in pool.log("heal") and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        took = time.monotonic() - t0
        lost = next((ln for ln in pool.log("heal").splitlines() if "NodeLostError" in ln), "")
        deadline = time.monotonic() + RUN_TIMEOUT
        while pool.plan("heal")["nodes"][0]["env"]["GPUFLEET_RUN"] == "1":
            assert time.monotonic() < deadline, "no second run"
            time.sleep(0.2)
        second = [pool.index(n["address"]) for n in pool.plan("heal")["nodes"]]
        pool.open_gates()
        code = job.wait(timeout=RUN_TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
        for k in range(1, pool.hosts.count + 1):
            if not pool.hosts.pids(k):
                pool.hosts.start(k)  # back for the next tests
    return Healed(code, pool.lab.status("heal"), used, second, victim, took, lost,
                  any(key in env for _, env in procs),
                  [cmd for cmd, _ in procs if key in cmd], pool.wait_clean())


def test_a_job_from_a_folder_only_here_runs_on_two_hosts(pool: Pool, healed: Healed) -> None:
    status = healed.status
    assert healed.code == 0, status
    assert (status["status"], status["step"], status["world_size"]) == ("succeeded", 3, 4), status
    assert len(set(healed.first)) == len(set(healed.second)) == 2
    logs = pool.lab.home / "jobs" / "heal" / "logs"
    assert "step 3: loss" in (logs / "rank0.log").read_text()
    for rank in range(4):
        assert (logs / f"rank{rank}.log").stat().st_size > 0, rank


def test_the_ranks_files_come_back_into_the_job_folder(pool: Pool, healed: Healed) -> None:
    """torchrun's per-rank files, written on the hosts, are in the submitter's job folder."""
    back = sorted((pool.lab.home / "jobs" / "heal" / "torchrun").glob("heal-2_*/attempt_0/*/"
                                                                      "stdout.log"))
    assert len(back) == 4, back  # 2 local ranks on each of 2 hosts
    assert len({f.parents[2] for f in back}) == 2  # one torchrun log folder per host
    assert any("step 3: loss" in f.read_text() for f in back)


def test_the_workdir_goes_only_where_it_is_missing_and_is_removed_after(
        pool: Pool, healed: Healed) -> None:
    shipped = re.findall(r"workdir \w+: (\d+) bytes shipped to \w+ \(169\.254\.\d+\.1(\d)\)",
                         pool.log("heal"))
    first, second = shipped[:2], shipped[2:]
    assert sorted(int(k) for _, k in first) == sorted(healed.first), shipped
    assert all(int(n) > 0 for n, _ in first), shipped
    # the survivor has it already; the third host gets it
    assert {int(k): int(n) > 0 for n, k in second} == \
        {k: k != healed.first[0] for k in healed.second}, shipped
    assert healed.left == {}, "processes or copies left on the hosts"


def test_no_command_line_on_a_host_shows_the_jobs_key(healed: Healed) -> None:
    assert healed.key_in_workers, "the key reached the workers (through stdin, not argv)"
    assert healed.key_on_command_lines == []


def test_a_killed_host_is_named_within_10_s_and_the_job_heals_on_the_third(
        pool: Pool, healed: Healed) -> None:
    assert healed.named_after_s < 10, f"the lost host was named after {healed.named_after_s} s"
    assert pool.hosts.address(healed.victim) in healed.lost_line, healed.lost_line
    assert sorted(healed.second) == sorted({1, 2, 3} - {healed.victim})
    assert any(f"node {pool.hosts.address(healed.victim)} lost; replaced by node" in e["reason"]
               for e in healed.status["events"]), healed.status["events"]


def test_the_hosts_see_none_of_the_submitters_files(pool: Pool) -> None:
    """shipping.SharesFiles for SSH: `cat` over ssh reads the probe file on no host; a file
    the hosts do share (the harness's folder) is seen."""
    from gpufleet.backends.ssh_plan import sees

    engine = pool.engine()
    ids = [pool.hosts.address(k) for k in (1, 2, 3)]
    probe = pool.project / "probe.txt"
    probe.write_text("only here")
    assert sees(engine, ids, probe, "only here") == dict.fromkeys(ids, False)
    shared = Path(pool.hosts.root) / "probe.txt"
    shared.write_text("on every host")
    assert sees(engine, ids, shared, "on every host") == dict.fromkeys(ids, True)
    assert sees(engine, ids, shared, "other content") == dict.fromkeys(ids, False)


# ----------------------------------------------------------- a job that fails, restarted once


@pytest.fixture(scope="module")
def boom(pool: Pool) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    r = pool.lab("run", "--gpu", "cpu", "--count", "4", "--nodes", "2", "--name", "boom", "-y",
                 "--max-restarts", "1", "--checkpoint-to", str(pool.durable / "boom"),
                 "train.py", "--", "--max_steps", "6", "--fail-at", "2", "--fail-rank", "3",
                 timeout=RUN_TIMEOUT)
    return r, pool.lab.status("boom")


def test_a_failing_ranks_error_record_comes_back(pool: Pool, boom: Any) -> None:
    r, status = boom
    assert r.returncode != 0 and status["status"] == "failed", said(r)
    assert re.match(r"rank 3 failed \(exit code 1\): RuntimeError: boom at step 2 on rank 3",
                    status["reason"]), status["reason"]
    records = list((pool.lab.home / "jobs" / "boom" / "torchrun").glob("*/attempt_*/*/error.json"))
    assert any("boom at step 2 on rank 3" in f.read_text() for f in records), records


def test_a_second_run_with_the_same_workdir_ships_nothing(pool: Pool, boom: Any) -> None:
    shipped = re.findall(r"workdir \w+: (\d+) bytes shipped to (\w+)", pool.log("boom"))
    assert len(shipped) == 4, shipped  # two runs, two hosts each
    assert [int(n) > 0 for n, _ in shipped[:2]] == [True, True]
    assert [int(n) for n, _ in shipped[2:]] == [0, 0]
    assert pool.wait_clean() == {}  # the job's last run removed the copies


# ------------------------------------------------------------------------------ stop


def test_after_stop_nothing_of_the_job_is_left_on_any_host(pool: Pool) -> None:
    pool.close_gates()
    job = pool.lab.popen("run", "--gpu", "cpu", "--count", "4", "--nodes", "2", "--name",
                         "held", "-y", "train.py", "--", "--max_steps", "3", "--gate", GATE)
    try:
        pool.lab.wait_for_step("held", 1, timeout=RUN_TIMEOUT)
        assert any(pool.leftovers().values())  # the job is there now
        pool.lab.ok("stop", pool.lab.status("held")["cluster"])
        job.wait(timeout=RUN_TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
    assert pool.wait_clean() == {}


def _driver(lab: Lab) -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "gpufleet.backends.ssh_run" in " ".join(proc.info["cmdline"] or []) and \
                    proc.environ().get("GPUFLEET_HOME") == str(lab.home):
                return proc
        except psutil.Error:
            continue
    raise AssertionError("no driver of this fleet is running")


def test_a_cut_link_is_named_and_the_cut_off_host_ends_its_workers_itself(pool: Pool) -> None:
    """A partition: the driver names the host within 10 s; the host, which still runs, hears
    nothing more from the driver and ends the job's processes on its own."""
    pool.close_gates()
    job = pool.lab.popen("run", "--gpu", "cpu", "--count", "4", "--nodes", "2", "--name",
                         "cut", "-y", "train.py", "--", "--max_steps", "3", "--gate", GATE)
    cut = 0
    try:
        pool.lab.wait_for_step("cut", 1, timeout=RUN_TIMEOUT)
        cut = pool.index(pool.plan("cut")["nodes"][1]["address"])
        t0 = time.monotonic()
        pool.hosts.cut(cut)
        while "NodeLostError" not in pool.log("cut") and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        took = time.monotonic() - t0
        assert took < 10, f"the cut-off host was named after {took:.1f} s"
        lost = next(ln for ln in pool.log("cut").splitlines() if "NodeLostError" in ln)
        assert pool.hosts.address(cut) in lost, lost
        assert job.wait(timeout=RUN_TIMEOUT) != 0
        # still cut off: its workers end by themselves (no word from the driver for 20 s)
        deadline = time.monotonic() + 120
        while [c for c, _ in processes(pool.hosts, cut) if "torch" in c] and \
                time.monotonic() < deadline:
            time.sleep(0.5)
        assert [c for c, _ in processes(pool.hosts, cut) if "torch" in c] == []
    finally:
        if cut:
            pool.hosts.mend(cut)
        if job.poll() is None:
            job.kill()
    assert pool.wait_clean() == {}


def test_a_killed_driver_leaves_nothing_on_the_hosts(pool: Pool) -> None:
    pool.close_gates()
    job = pool.lab.popen("run", "--gpu", "cpu", "--count", "4", "--nodes", "2", "--name",
                         "orphan", "-y", "train.py", "--", "--max_steps", "3", "--gate", GATE)
    try:
        pool.lab.wait_for_step("orphan", 1, timeout=RUN_TIMEOUT)
        assert any(pool.leftovers().values())
        _driver(pool.lab).kill()
        job.wait(timeout=RUN_TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
    assert pool.wait_clean() == {}
