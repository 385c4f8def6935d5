"""The queue on this host, with real jobs and the local server the CLI starts on demand: jobs
that do not fit wait and start in priority, then submission, order, never more devices in use
than the pool has; a queued job is cancelled; a supervisor killed with kill -9 is noticed by the
server, its devices freed and the next job started."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from fleet_helpers import WORKERS, Fleet, error_lines

GATED = str(WORKERS / "gated.py")


def submit(fleet: Fleet, name: str, gate: Path, *extra: str,
           env: dict[str, str] | None = None) -> str:
    r = fleet("run", GATED, "--gpu", "cpu", "--count", "1", "--name", name, "-d", "-y", *extra,
              "--", str(gate), env=env)
    assert r.returncode == 0, r.stderr
    return r.stderr + r.stdout


def rows(fleet: Fleet) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in fleet.json("jobs", "--all", "--json")}


def wait_all_ended(fleet: Fleet, names: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = rows(fleet)
        if all(found.get(n, {}).get("status") in ("succeeded", "failed", "stopped",
                                                  "interrupted", "cancelled") for n in names):
            return found
        time.sleep(1.0)
    raise AssertionError(f"not all ended in {timeout}s: {rows(fleet)}")


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda p: (p[0], p[1]))
    most = held = 0
    for _, d in points:
        held += d
        most = max(most, held)
    return most


def test_six_jobs_share_two_slots_in_priority_then_submission_order(fleet: Fleet,
                                                                    tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    pri = {"j1": 0, "j2": 0, "j3": 0, "j4": 5, "j5": 0, "j6": 5}
    said = {n: submit(fleet, n, gate, "--priority", str(p),
                      env={"QUEUE_TEST_MARK": n} if n == "j5" else None)
            for n, p in pri.items()}
    assert "queued" not in said["j1"] and "queued" not in said["j2"]
    for n in ("j3", "j4", "j5", "j6"):
        assert f"Job {n} is queued" in said[n], said[n]
    # a seventh, queued and then cancelled: it never runs
    assert "queued" in submit(fleet, "j7", gate)
    listed = rows(fleet)
    waiting = sorted((r for r in listed.values() if r["status"] == "queued"),
                     key=lambda r: r["position"])
    assert [r["name"] for r in waiting] == ["j4", "j6", "j3", "j5", "j7"]
    assert all(r["reason"] for r in waiting)
    assert fleet.ok("cancel", "j7").stdout.startswith("Job j7: cancelled")
    again = fleet("cancel", "j7")
    assert again.returncode == 2 and "cancelled, not queued" in again.stderr
    status = fleet.json("status", "j3", "--json")
    assert fleet.json("status", "j4", "--json")["status"] == "queued"
    assert status["status"] == "queued" and status["position"] >= 1
    logs = fleet("logs", "j3")
    assert logs.returncode == 0 and "is queued" in logs.stderr
    gate.touch()
    names = list(pri)
    done = wait_all_ended(fleet, names, timeout=240)
    assert {n: done[n]["status"] for n in names} == dict.fromkeys(names, "succeeded")
    # a queued job starts in the shell environment it was submitted from, not the server's
    assert "(mark j5)" in fleet.ok("logs", "j5").stdout
    assert "(mark -)" in fleet.ok("logs", "j3").stdout
    events = [e["kind"] for e in fleet.status("j4")["events"]]
    assert events[:2] == ["queued", "starting"], events  # its wait is in its history
    assert done["j7"]["status"] == "cancelled"
    assert all(r["user"] for r in done.values())
    audit = fleet.json("admin", "audit", "--json")
    starts = [e["subject"] for e in reversed(audit) if e["action"] == "start"]  # oldest first
    assert starts == ["j4", "j6", "j3", "j5"], audit
    clusters = [c for c in fleet.clusters(all_=True)]
    spans = [(c["started_at"], c["stopped_at"]) for c in clusters]
    assert len(spans) == 6 and all(e is not None for _, e in spans)
    assert max_overlap(spans) <= 2, spans
    # the ledger holds every job's cost, to the micro-dollar
    usage = fleet.json("usage", "--by", "job", "--json")
    booked = {g["job"]: g["micro_usd"] for g in usage["groups"]}
    for n in names:
        assert booked[n] == round(done[n]["cost_usd"] * 1_000_000), (n, booked, done[n])
    assert usage["micro_usd"] == sum(booked.values())


def _peek(home: Path, name: str) -> tuple[str, int | None] | None:
    db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        row = db.execute("SELECT status, supervisor_pid FROM jobs WHERE name = ?",
                         (name,)).fetchone()
    finally:
        db.close()
    return None if row is None else (row[0], row[1])


def test_a_killed_supervisor_is_noticed_by_the_server_and_the_next_job_starts(
        fleet: Fleet, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # never opened: the first job runs until its supervisor dies
    submit(fleet, "first", gate, "--count", "2")
    assert "queued" in submit(fleet, "second", tmp_path / "open")
    (tmp_path / "open").touch()
    server = json.loads((fleet.home / "server.json").read_text())
    assert server["url"].startswith("http://127.0.0.1:")
    deadline = time.monotonic() + 60
    seen = None
    while time.monotonic() < deadline:
        seen = _peek(fleet.home, "first")
        if seen and seen[0] == "running" and seen[1]:
            break
        time.sleep(0.2)
    assert seen and seen[1], seen
    os.kill(seen[1], signal.SIGKILL)  # the supervisor this test's job started
    killed = time.monotonic()
    noticed = None
    while time.monotonic() - killed < 30:
        now = _peek(fleet.home, "first")
        if now and now[0] == "interrupted":
            noticed = time.monotonic() - killed
            break
        time.sleep(0.1)
    # read from the state file only: nothing but the server's loop can have noticed it
    assert noticed is not None and noticed < 10, noticed
    done = wait_all_ended(fleet, ["second"], timeout=120)
    assert done["second"]["status"] == "succeeded"
    assert done["first"]["status"] == "interrupted"


def test_no_queue_refuses_and_a_job_that_never_fits_is_not_queued(fleet: Fleet,
                                                                   tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    submit(fleet, "holder", gate, "--count", "2")
    r = fleet("run", GATED, "--gpu", "cpu", "--count", "1", "--no-queue", "-d", "-y", "--",
              str(gate))
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1, r.stderr
    big = fleet("run", GATED, "--gpu", "cpu", "--count", "3", "-d", "-y", "--", str(gate))
    assert big.returncode == 2 and "queued" not in big.stderr, big.stderr
    bad = fleet("run", GATED, "--gpu", "cpu", "--time-limit", "soon", "-d", "-y", "--",
                str(gate))
    assert bad.returncode == 2 and "time_limit" in bad.stderr, bad.stderr
    assert [r["name"] for r in fleet.json("jobs", "--json")] == ["holder"]
    gate.touch()


def test_a_job_past_its_time_limit_is_stopped_with_that_reason(fleet: Fleet,
                                                               tmp_path: Path) -> None:
    submit(fleet, "limited", tmp_path / "never", "--time-limit", "3s")
    ended = fleet.wait_ended("limited", timeout=90)
    assert ended["status"] == "stopped", ended
    assert "ran past its time limit (3s)" in ended["reason"], ended
