"""The queue on this host, with real jobs and the local server the CLI starts on demand: jobs
that do not fit wait and start in priority, then submission, order, never more devices in use
than the pool has; a queued job is cancelled; a supervisor killed with kill -9 is noticed by the
server, its devices freed and the next job started."""

from __future__ import annotations

import json
import os
import re
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
    # the first queued job starts the local server, which takes seconds: it says so, once
    starting = "Starting the local queue server"
    assert [n for n in pri if starting in said[n]] == ["j3"], said
    # a seventh, queued and then cancelled: it never runs
    assert "queued" in submit(fleet, "j7", gate)
    # a job just queued has its position once the server's next pass has ranked it
    deadline = time.monotonic() + 60
    listed = rows(fleet)
    while any(r["status"] == "queued" and r["position"] is None for r in listed.values()) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
        listed = rows(fleet)
    waiting = sorted((r for r in listed.values() if r["status"] == "queued"),
                     key=lambda r: r["position"])
    assert [r["name"] for r in waiting] == ["j4", "j6", "j3", "j5", "j7"]
    assert all(r["reason"] for r in waiting)
    # no estimate, and the true reason why: j1 and j2 run without a time limit
    assert {r["start_note"] for r in waiting} == {"unknown (a running job has no --time-limit)"}
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
    # a wait, not a bound on the server's speed: its loop beats every few seconds, and under
    # load a beat can come late; a server that never looks fails after 120 s
    while time.monotonic() - killed < 120:
        now = _peek(fleet.home, "first")
        if now and now[0] == "interrupted":
            noticed = time.monotonic() - killed
            break
        time.sleep(0.1)
    # read from the state file only: nothing but the server's loop can have noticed it
    assert noticed is not None, _peek(fleet.home, "first")
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


def _beat_after(fleet: Fleet, t: float, timeout: float = 300.0) -> None:
    """Wait for a beat of the local server that began after `t` (its queue pass read the
    store after then), as its /api/v1/health tells its owner."""
    import urllib.request

    server = json.loads((fleet.home / "server.json").read_text())
    req = urllib.request.Request(f"{server['url']}/api/v1/health",
                                 headers={"Authorization": f"Bearer {server['token']}"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(req, timeout=30) as resp:
            if (json.loads(resp.read())["beat_at"] or 0) > t:
                return
        time.sleep(0.2)
    raise AssertionError(f"no beat of the local server after {t} in {timeout}s")


def _state(home: Path, sql: str, *args: str) -> list[tuple[Any, ...]]:
    """Rows read straight from the state file (read-only): a poll that costs no CLI start."""
    db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def _until(what: str, check: Any, timeout: float = 300.0) -> None:
    """Wait for an event (generously: the machine may be loaded; a pass is cheap)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what}")
        time.sleep(0.3)


def _queue_is(home: Path, name: str, *fields: str) -> bool:
    """Whether the queue entry's (status, wait) are `fields`."""
    found = _state(home, "SELECT status, wait FROM queue WHERE name = ?", name)
    return bool(found) and found[0][:len(fields)] == fields


def _clusters_up(home: Path) -> int:
    return len(_state(home, "SELECT id FROM clusters WHERE status IN ('pending', 'running')"))


def _ended(home: Path, *names: str) -> bool:
    found = dict(_state(home, "SELECT name, status FROM jobs"))
    return all(found.get(n) in ("succeeded", "failed", "stopped", "interrupted") for n in names)


def test_after_waits_for_success_a_failed_link_is_cancelled_and_a_held_job_waits_for_release(
        fleet: Fleet, tmp_path: Path) -> None:
    gate_a, gate_f, open_ = tmp_path / "a", tmp_path / "f", tmp_path / "open"
    open_.touch()
    home = fleet.home
    submit(fleet, "a", gate_a)
    failing = fleet("run", GATED, "--gpu", "cpu", "--count", "1", "--name", "f", "-d", "-y",
                    "--", str(gate_f), "0", "3")
    assert failing.returncode == 0, failing.stderr
    assert "Job b is queued: it starts once a succeeded." in submit(fleet, "b", open_,
                                                                    "--after", "a")
    assert "queued" in submit(fleet, "g", open_, "--after", "f")
    assert "queued" in submit(fleet, "h", open_)
    assert fleet.ok("hold", "h").stdout.startswith("Job h: held;")
    unknown = fleet("run", GATED, "--gpu", "cpu", "--after", "nosuch", "-d", "-y", "--", "x")
    assert unknown.returncode == 2 and len(error_lines(unknown.stderr)) == 1, unknown.stderr
    assert "after: no job named 'nosuch'" in unknown.stderr, unknown.stderr
    _until("b waits for a", lambda: _queue_is(home, "b", "queued", "after"))
    table = fleet.ok("jobs").stdout
    assert re.search(r"^b .* queued .* #\d after a .* after a: starts once a succeeds \(a is "
                     r"running\)", table, re.M), table
    assert re.search(r"^h .* held .* #\d held .* held: it keeps its place", table, re.M), table

    gate_f.touch()  # f fails: g can never start; a slot is free, yet b waits for a
    _until("g cancelled", lambda: _queue_is(home, "g", "cancelled"))
    _until("f's devices freed", lambda: _clusters_up(home) == 1)
    _beat_after(fleet, time.time())  # a pass that saw the free slot
    assert _queue_is(home, "b", "queued", "after") and _queue_is(home, "h", "queued", "held")

    gate_a.touch()  # a succeeds: b starts after it; h stays held on free devices
    _until("a and b ended", lambda: _ended(home, "a", "b"))
    _until("every device freed", lambda: _clusters_up(home) == 0)
    _beat_after(fleet, time.time())
    assert _queue_is(home, "h", "queued", "held")
    assert fleet.ok("release", "h").stdout.startswith("Job h: released")
    _until("h ended", lambda: _ended(home, "h"))
    done = rows(fleet)
    assert {n: done[n]["status"] for n in "abfgh"} == {
        "a": "succeeded", "b": "succeeded", "f": "failed", "g": "cancelled", "h": "succeeded"}
    assert done["b"]["started_at"] >= done["a"]["ended_at"], done
    assert done["g"]["reason"] == ("cancelled: job f, which it runs after, ended failed; --after "
                                   "starts a job only once that one succeeds"), done["g"]

    audit = fleet.ok("admin", "audit").stdout.splitlines()
    assert audit[0].split() == ["TIME", "USER", "ACTION", "SUBJECT", "DETAIL"], audit
    col = audit[0].index("ACTION")  # every row's action starts under its header
    actions = [line[col:].split()[0] for line in audit[1:] if len(line) > col]
    assert {"submit", "start", "hold", "release", "cancel"} <= set(actions), audit
    assert any(line[col:].startswith("cancel") and " g " in line for line in audit), audit
