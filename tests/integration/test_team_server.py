"""A team server with real users: tokens, a team's GPU quota and monthly budget enforced at
admission, each user seeing and acting on their own jobs, the ledger equal to the jobs' costs
and a member's idle cluster in the team's spend, the audit trail, and the one-line errors of
bad input, a bad token and an older server."""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import sqlite3
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import CLI, WORKERS, Fleet, _base_env, error_lines, serving
from test_queue import max_overlap, wait_all_ended
from test_store_backends import pg_database  # noqa: F401 (a fixture)

from gpufleet.plan.cost import accrued_usd

GATED = str(WORKERS / "gated.py")


@pytest.fixture
def server(make_fleet: Callable[[str, int], Fleet]) -> Iterator[tuple[str, Fleet]]:
    """`gpufleet server` on a free loopback port, its state in the fleet's home."""
    yield from serving(make_fleet("server", 2))


def as_user(fleet: Fleet, url: str, token: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return fleet(*args, env={"GPUFLEET_SERVER": url, "GPUFLEET_TOKEN": token})
    return call


def ok_json(call: Callable[..., subprocess.CompletedProcess[str]], *args: str) -> Any:
    r = call(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def api(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    """One API call with a user's token: its JSON, or the HTTP status of a refusal."""
    req = urllib.request.Request(url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_team_server_enforces_quotas_and_budgets_and_books_every_cost(
        server: tuple[str, Fleet], make_fleet: Callable[[str, int], Fleet],
        tmp_path: Path) -> None:
    url, srv = server
    admin_home = make_fleet("admin", 2)
    r = admin_home("login", url, "--token-file", str(srv.home / "admin-token"))
    assert r.returncode == 0 and "as admin" in r.stdout, r.stderr
    admin = admin_home  # logged in: its commands go to the server
    tokens = {}
    for name, team in (("alice", "ml"), ("bob", "ml"), ("carol", "lab")):
        r = admin("admin", "user", "add", name, "--team", team)
        assert r.returncode == 0, r.stderr
        tokens[name] = r.stdout.strip()
    assert admin("admin", "quota", "set", "ml", "cpu", "1").returncode == 0
    for args, field in ((("quota", "set", "ml", "cpu", "-1"), "devices"),
                        (("quota", "set", "nosuch", "cpu", "1"), "team"),
                        (("budget", "set", "lab", "5", "--month", "2020-01"), "month"),
                        (("budget", "set", "lab", "-3"), "usd"),
                        (("user", "add", "alice"), "name")):
        bad = admin("admin", *args)
        assert bad.returncode == 2 and len(error_lines(bad.stderr)) == 1, (args, bad.stderr)
        assert field in bad.stderr, (args, bad.stderr)
    users = {n: as_user(make_fleet(n, 2), url, t) for n, t in tokens.items()}
    gate = tmp_path / "gate"

    def run(who: str, name: str, *extra: str) -> str:
        r = users[who]("run", GATED, "--gpu", "cpu", "--count", "1", "--name", name, "-d",
                       *extra, "--", str(gate))
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr

    assert "started" in run("alice", "a1")
    assert "queued" in run("alice", "a2")
    assert "queued" in run("bob", "b1")
    # the whole queue for everyone, as squeue shows it; other users' job names only to admins
    mine = ok_json(users["alice"], "jobs")
    assert sorted((r["name"], r["user"]) for r in mine) == [("(hidden)", "bob"), ("a1", "alice"),
                                                            ("a2", "alice")]
    # "started" is a1 handed to its supervisor; it says "running" once its workers are up (an
    # event of its own: bob's listing read "starting" on a loaded machine)
    admin.wait_for("a1", lambda st: st.get("status") == "running")
    theirs_seen = ok_json(users["bob"], "jobs")
    assert sorted((r["name"], r["user"], r["status"]) for r in theirs_seen) == [
        ("(hidden)", "alice", "queued"), ("(hidden)", "alice", "running"),
        ("b1", "bob", "queued")]
    assert "a1" not in json.dumps(theirs_seen) and "a2" not in json.dumps(theirs_seen)
    # bob holds his own job, not alice's; each refusal is in the audit trail. Through the CLI
    # where the CLI is what is shown; the rest as plain API calls, which cost no CLI start.
    assert users["bob"]("hold", "b1").returncode == 0
    bobs = api(url, tokens["bob"], "GET", "/api/v1/jobs?everyone=true")
    assert [(r["status"], r["held_by"], r["wait"]) for r in bobs if r["name"] == "b1"] == [
        ("queued", "bob", "held")]
    assert api(url, tokens["bob"], "POST", "/api/v1/jobs/a2/hold") == 403
    assert users["bob"]("release", "b1").returncode == 0
    for extra, field in (({"cluster": {"gpu": "cpu", "count": 2}}, "count"),  # over the quota
                         ({"time_limit": "soon"}, "time_limit"),
                         ({"after": "a1"}, "after")):  # alice's job, not bob's
        body = {"spec": {"script": GATED, "args": [str(gate)], "name": "b9",
                         "cluster": {"gpu": "cpu", "count": 1}, **extra}}
        assert api(url, tokens["bob"], "POST", "/api/v1/jobs", body) == 400, field
    held = {r["name"]: r for r in ok_json(admin, "jobs")}
    deadline = time.monotonic() + 20
    while not held["b1"].get("reason") and time.monotonic() < deadline:
        time.sleep(0.5)
        held = {r["name"]: r for r in ok_json(admin, "jobs")}
    assert "quota" in held["b1"]["reason"] and "ml" in held["b1"]["reason"], held["b1"]
    theirs = users["bob"]("cancel", "a2")
    assert theirs.returncode == 2 and "not yours (bob)" in theirs.stderr, theirs.stderr
    assert "alice" not in theirs.stderr  # whose it is, is not bob's to learn
    forged = urllib.request.Request(f"{url}/api/v1/jobs/a2/cancel", method="POST",
                                    headers={"Cookie": f"gpufleet_token={tokens['alice']}"})
    with pytest.raises(urllib.error.HTTPError) as refused:  # the cookie only reads
        urllib.request.urlopen(forged, timeout=30)
    assert refused.value.code == 401
    second = srv("server", "--port", "0")
    assert second.returncode == 2 and "another gpufleet server serves" in second.stderr, \
        second.stderr
    gate.touch()
    done = wait_all_ended(admin, ["a1", "a2", "b1"], timeout=180)
    assert {n: done[n]["status"] for n in ("a1", "a2", "b1")} == dict.fromkeys(
        ("a1", "a2", "b1"), "succeeded")
    spans = [(done[n]["started_at"], done[n]["ended_at"]) for n in ("a1", "a2", "b1")]
    assert max_overlap(spans) == 1, spans  # the team's one cpu, one job at a time

    # lab's budget: about two seconds of one CPU slot; the first job spends it
    assert admin("admin", "budget", "set", "lab", "0.00002").returncode == 0
    assert "started" in run("carol", "c1")
    wait_all_ended(admin, ["c1"], timeout=90)
    assert "queued" in run("carol", "c2")
    reason = ""
    deadline = time.monotonic() + 20
    while "spent" not in reason and time.monotonic() < deadline:
        time.sleep(0.5)
        reason = {r["name"]: r for r in ok_json(users["carol"], "jobs")}["c2"]["reason"] or ""
    assert "team lab has spent its $0.000020 monthly budget" in reason, reason
    assert admin("admin", "budget", "set", "lab", "100").returncode == 0
    done = wait_all_ended(admin, ["c1", "c2"], timeout=90)
    assert done["c2"]["status"] == "succeeded"

    usage = ok_json(admin, "usage", "--by", "job")
    booked = {g["job"]: g["micro_usd"] for g in usage["groups"]}
    everything = {r["name"]: r for r in ok_json(admin, "jobs", "--all")}
    for n in ("a1", "a2", "b1", "c1", "c2"):
        assert booked[n] == round(everything[n]["cost_usd"] * 1_000_000) > 0, n
    by_team = {g["team"]: g["micro_usd"] for g in ok_json(admin, "usage", "--by", "team")["groups"]}
    assert by_team == {"ml": booked["a1"] + booked["a2"] + booked["b1"],
                       "lab": booked["c1"] + booked["c2"]}
    own = ok_json(users["alice"], "usage", "--by", "user")
    assert [g["user"] for g in own["groups"]] == ["alice"]
    assert own["micro_usd"] == booked["a1"] + booked["a2"]
    audit = ok_json(admin, "admin", "audit")
    did = {(e["user"], e["action"], e["subject"]) for e in audit}
    assert {("alice", "submit", "a1"), ("bob", "submit", "b1"), ("carol", "submit", "c2"),
            ("admin", "quota_set", "ml"), ("admin", "budget_set", "lab"),
            ("admin", "user_add", "carol"), ("bob", "hold", "b1"), ("bob", "release", "b1"),
            ("bob", "hold_refused", "a2"), ("bob", "cancel_refused", "a2")} <= did
    refusals = [e["detail"] for e in audit if (e["user"], e["action"], e["subject"]) ==
                ("bob", "submit_refused", "b9")]
    assert [d.split(":")[0] for d in reversed(refusals)] == ["count", "time_limit", "after"], \
        refusals
    listed = admin("admin", "user", "list").stdout.splitlines()
    assert listed[0].split() == ["USER", "TEAM", "ADMIN", "ADDED"], listed
    assert [line.split()[:3] for line in listed[1:]] == [
        ["admin", "-", "admin"], ["alice", "ml", "-"], ["bob", "ml", "-"], ["carol", "lab", "-"]]
    # clusters through the server: launch, list and stop go to it once logged in
    made = admin("launch", "--gpu", "cpu", "--count", "1", "--name", "shared")
    assert made.returncode == 0 and "Cluster shared" in made.stdout, made.stderr
    assert [c["name"] for c in json.loads(admin("list", "--json").stdout)] == ["shared"]
    assert json.loads(users["bob"]("list", "--json").stdout) == []  # not his
    theirs = users["bob"]("stop", "shared", "-y")
    assert theirs.returncode == 2 and "not yours" in theirs.stderr, theirs.stderr
    admin_token = (srv.home / "admin-token").read_text().strip()
    assert ("bob", "stop_refused", "shared") in {
        (e["user"], e["action"], e["subject"])
        for e in api(url, admin_token, "GET", "/api/v1/admin/audit")}
    assert admin("stop", "shared", "-y").returncode == 0
    assert json.loads(admin("list", "--json").stdout) == []
    # a team member's cluster, reserved and never used: its time is carol's and lab's spend,
    # and `stop` through the server says what it cost, as it does locally
    assert users["carol"]("launch", "--gpu", "cpu", "--count", "1", "--name", "lab-dev").returncode == 0
    stopped = users["carol"]("stop", "lab-dev", "-y")
    assert stopped.returncode == 0 and re.search(
        r"^Cluster lab-dev: stopped, devices freed, cost \$\d+\.\d{4}$", stopped.stdout, re.M), \
        stopped.stdout + stopped.stderr
    with contextlib.closing(sqlite3.connect(f"file:{srv.home / 'state.db'}?mode=ro", uri=True)) as db:
        rate, started, ended = db.execute("SELECT usd_per_hour, started_at, stopped_at FROM clusters "
                                          "WHERE name = 'lab-dev'").fetchone()
    idle = {g["job"]: g for g in ok_json(admin, "usage", "--by", "job")["groups"]}["(idle) lab-dev"]
    assert idle["micro_usd"] == round(accrued_usd(rate, started, ended, 0.0) * 1e6) > 0
    by_team = {g["team"]: g["micro_usd"] for g in ok_json(admin, "usage", "--by", "team")["groups"]}
    assert by_team["lab"] == booked["c1"] + booked["c2"] + idle["micro_usd"]
    lab = next(t for t in ok_json(admin, "admin", "teams") if t["team"] == "lab")
    assert round(lab["spent_usd"] * 1e6) == by_team["lab"]  # what its budget is judged against
    no_admin = users["bob"]("admin", "user", "add", "mallory")
    assert no_admin.returncode == 2 and "only an admin" in no_admin.stderr
    bogus = as_user(make_fleet("bogus", 2), url, "not-a-token")("jobs")
    assert bogus.returncode == 2 and "no user has this token" in bogus.stderr, bogus.stderr


class _OldServer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"api": 99, "version": "9.9.9"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_a_server_of_another_api_version_is_one_clear_line(tmp_path: Path) -> None:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _OldServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        env = {**_base_env(), "GPUFLEET_HOME": str(tmp_path / "home"),
               "GPUFLEET_SERVER": f"http://127.0.0.1:{httpd.server_port}",
               "GPUFLEET_TOKEN": "x"}
        r = subprocess.run([*CLI, "jobs"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        httpd.shutdown()
    assert r.returncode == 2 and len(error_lines(r.stderr)) == 1, r.stderr
    assert "speaks API v99" in r.stderr and "Traceback" not in r.stderr
    gone = subprocess.run([*CLI, "jobs"], env={**env, "GPUFLEET_SERVER": "http://127.0.0.1:9"},
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 2 and "cannot reach" in gone.stderr, gone.stderr



def test_a_server_on_postgresql_queues_runs_and_books_jobs(
        pg_database: str, make_fleet: Callable[[str, int], Fleet], tmp_path: Path) -> None:  # noqa: F811
    """The same server with its store on PostgreSQL: its supervisors open that database too
    (GPUFLEET_DB), so jobs run, queue, end and are booked there, and nothing is in SQLite."""
    srv = make_fleet("pg-server", 2)
    gen = serving(srv, "--db", pg_database)
    url, _ = next(gen)
    try:
        admin = make_fleet("pg-admin", 2)
        assert admin("login", url, "--token-file", str(srv.home / "admin-token")).returncode == 0
        token = admin("admin", "user", "add", "dana", "--team", "ml").stdout.strip()
        dana = as_user(make_fleet("dana", 2), url, token)
        gate = tmp_path / "gate"
        first = dana("run", GATED, "--gpu", "cpu", "--count", "2", "--name", "p1", "-d", "--",
                     str(gate))
        assert first.returncode == 0 and "started" in first.stdout, first.stderr
        second = dana("run", GATED, "--gpu", "cpu", "--count", "1", "--name", "p2", "-d", "--",
                      str(gate))
        assert second.returncode == 0 and "queued" in second.stderr, second.stderr
        gate.touch()
        done = wait_all_ended(admin, ["p1", "p2"], timeout=120)
        assert done["p1"]["status"] == done["p2"]["status"] == "succeeded", done
        booked = {g["job"]: g["micro_usd"]
                  for g in ok_json(admin, "usage", "--by", "job")["groups"]}
        assert booked == {n: round(done[n]["cost_usd"] * 1_000_000) for n in ("p1", "p2")}
        assert not (srv.home / "state.db").exists()
    finally:
        gen.close()
