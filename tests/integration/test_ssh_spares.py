"""Spare nodes on an SSH pool of the three test machines (`--spares 1`), through the real CLI.

A job on two machines holds the third as its spare: `list` shows it, each run warms it (the
workdir shipped, the setup run) while the workers train, and when one of the two machines is
killed the next run starts on the survivor and the spare, neither of which ships or sets up
anything then. With no free machine left for a new spare the job's events say so. A second job
that loses nothing lets its spare's copy go at its end: the module's end finds nothing of ours
on any machine.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from ssh_pool_lab import GATE, RUN_TIMEOUT, Pool, said, ssh_pool

SETUP = "echo warming up"  # prints one line where it runs: `setup: warming up` in a node's log


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    yield from ssh_pool(tmp_path_factory)


@dataclass
class Spared:
    code: int
    status: dict[str, Any]
    listed: dict[str, Any]  # the cluster's `list --json` row while the first run waited
    first: list[str]  # machine names of each run's nodes
    second: list[str]
    spare: str  # the machine held as the spare
    victim: str
    log: str


def _row(pool: Pool, job: str) -> dict[str, Any]:
    rows = json.loads(pool.lab.ok("list", "--json").stdout)
    return next(r for r in rows if r["for_job"] == job)


@pytest.fixture(scope="module")
def spared(pool: Pool) -> Spared:
    pool.gates(open_=False)
    job = pool.lab.popen("run", "--gpu", "cpu", "--count", "2", "--nodes", "2", "--spares", "1",
                         "--name", "spared", "-y", "--max-restarts", "1", "--setup", SETUP,
                         "--checkpoint-to", str(pool.durable / "spared"), "train.py", "--",
                         "--max_steps", "3", "--gate", GATE)
    victim = ""
    try:
        pool.lab.wait_for_step("spared", 1, timeout=RUN_TIMEOUT)
        first = [pool.name(n["address"]) for n in pool.plan("spared")["nodes"]]
        listed = _row(pool, "spared")
        spare = pool.name(listed["spares"][0]) if listed["spares"] else ""
        deadline = time.monotonic() + RUN_TIMEOUT  # the warm runs beside the workers
        while not re.search(r"spare \S+ \(\S+\) (warm in|not warmed)", pool.log("spared")):
            assert time.monotonic() < deadline, pool.log("spared")[-3000:]
            time.sleep(0.2)
        assert "not warmed" not in pool.log("spared"), pool.log("spared")[-3000:]
        victim = first[1]
        pool.hosts.kill(victim)
        second = pool.second_run("spared")
        pool.gates(open_=True)
        code = job.wait(timeout=RUN_TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
        if victim:
            pool.hosts.start(victim)
    return Spared(code, pool.lab.status("spared"), listed, first, second, spare, victim,
                  pool.log("spared"))


def test_the_spare_is_a_third_machine_listed_beside_the_clusters_two(spared: Spared) -> None:
    assert spared.code == 0, spared.status
    assert len(spared.listed["spares"]) == 1, spared.listed
    assert spared.spare and spared.spare not in spared.first, (spared.spare, spared.first)
    assert (spared.listed["nodes"], spared.listed["count"]) == (2, 2)
    assert spared.spare not in spared.listed["placements"]


def test_the_spare_is_warmed_while_the_first_run_trains(pool: Pool, spared: Spared) -> None:
    address = pool.hosts.address(spared.spare)
    warm = re.search(rf"spare {re.escape(address)} \({re.escape(address)}\) warm in [\d.]+ s: "
                     r"workdir \w+ (\d+) bytes shipped, setup (\w+)", spared.log)
    assert warm is not None, spared.log[-3000:]
    assert int(warm.group(1)) > 0 and warm.group(2) == "ran", warm.group(0)


def test_a_killed_machine_is_replaced_by_the_spare_which_ships_and_sets_up_nothing(
        pool: Pool, spared: Spared) -> None:
    assert sorted(spared.second) == sorted({spared.first[0], spared.spare}), spared.second
    victim, spare = pool.hosts.address(spared.victim), pool.hosts.address(spared.spare)
    reasons = [e["reason"] for e in spared.status["events"]]
    assert f"node {victim} lost; replaced by spare node {spare} ({spare})" in reasons, reasons
    assert any(r.startswith("no free node for a new spare") for r in reasons), reasons
    shipped = re.findall(r"workdir \w+: (\d+) bytes shipped to \S+ \((169\.254\.[\d.]+)\)",
                         spared.log)
    assert len(shipped) == 4, shipped  # each run's two nodes
    assert sorted(a for _, a in shipped[2:]) == sorted(pool.hosts.address(n)
                                                       for n in spared.second), shipped
    assert all(n == "0" for n, _ in shipped[2:]), shipped  # the spare had it already
    # the setup ran on the first run's two nodes (and, out of the log, on the spare) only
    assert spared.log.count("setup: warming up") == 2, spared.log[-3000:]
    assert spared.status["status"] == "succeeded" and spared.status["step"] == 3


def test_a_job_that_loses_nothing_lets_its_spares_copy_go(pool: Pool, spared: Spared) -> None:
    r = pool.lab("run", "--gpu", "cpu", "--count", "2", "--nodes", "2", "--spares", "1",
                 "--name", "calm", "-y", "--setup", SETUP, "train.py", "--", "--max_steps",
                 "2", timeout=RUN_TIMEOUT)
    assert r.returncode == 0, said(r)
    assert re.search(r"spare \S+ \(\S+\) warm in", pool.log("calm")), pool.log("calm")[-2000:]
    assert pool.wait_clean() == {}, "the spare's copy (or a process) was left on a machine"


def test_spares_on_the_local_pool_are_one_line_and_exit_2(pool: Pool) -> None:
    r = pool.lab("run", "--pool", "local", "--gpu", "cpu", "--count", "2", "--spares", "1",
                 "-y", "train.py")
    assert r.returncode == 2, said(r)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "spares" in lines[0] and "ssh, ray" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_launch_quotes_and_lists_the_spare(pool: Pool) -> None:
    r = pool.lab("launch", "--pool", "lab", "--gpu", "cpu", "--count", "2", "--nodes", "1",
                 "--spares", "1", "--name", "held", "-y")
    try:
        assert r.returncode == 0, said(r)
        assert "The quote includes 1 spare node(s) of 2" in r.stderr, r.stderr
        assert "spare node(s): 169.254." in r.stdout, r.stdout
        table = pool.lab.ok("list").stdout
        assert re.search(r"held\s.*\s2 \+1 spare\s", table), table
    finally:
        pool.lab("stop", "held", "-y")
    assert [c for c in json.loads(pool.lab.ok("list", "--json").stdout)
            if c["name"] == "held"] == []
