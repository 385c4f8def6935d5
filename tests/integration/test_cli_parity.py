"""Every CLI command, run on this machine's own state and through a team server (issue 27: `list`
crashed for anyone logged in to a server; `logs -f` of a job that did not succeed exited 0).

One scenario per place, run once by a module fixture in the order a user would go: launch two
clusters, list them, run a short job in the foreground on one and a long one detached, look at
them (status, jobs, logs), follow the long one with `logs -f` while `stop` ends it, stop the other
cluster, list again with --all, usage, and the commands that read no state. Through the server the
user is a plain user (not an admin) logged in with `gpufleet login`, in a home of their own.
Each parametrized case then checks one command's recorded exit code and output for both places:
no traceback, and what proves the command worked. The two places use the same names, so a case
is one check, not two.

To stay cheap it runs two jobs per place, each a torchrun whose workers never import torch, and
every case reads the results of the one scenario.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fleet_helpers import WORKERS, Fleet, error_lines, serving
from test_server_clusters import caller

ECHO = str(WORKERS / "argv_echo.py")
NAPPER = str(WORKERS / "napper.py")
PLACES = ("local", "server")
USER = "alice"


@dataclass
class Place:
    """A user's CLI (`cli`), the CLI on the home that holds the state (`state`: the same one
    locally, the server's own home through the server), and what each command gave."""

    where: str
    cli: Fleet
    state: Fleet
    got: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def do(self, key: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        self.got[key] = self.cli(*args, timeout=timeout)
        return self.got[key]


def _first_line_with(proc: subprocess.Popen[str], text: str, timeout: float) -> list[str]:
    """Read `proc`'s stdout until a line has `text` (in a thread, so a silent process cannot
    hang the test); the lines read."""
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert seen.wait(timeout), f"no line with {text!r} in {timeout}s: {lines}"
    return lines


def scenario(p: Place) -> None:
    p.do("launch", "launch", "--gpu", "cpu", "--count", "1", "--name", "par-a", "-y")
    p.do("launch --json", "launch", "--gpu", "cpu", "--count", "1", "--name", "par-b", "-y",
         "--json")
    p.do("run", "run", "--cluster", "par-a", "--name", "par-j1", "-y", ECHO, "--", "hello")
    p.do("run -d", "run", "-d", "--cluster", "par-a", "--name", "par-j2", "-y", NAPPER)
    p.state.wait_for_step("par-j2", 1, timeout=120)
    p.do("list", "list")
    p.do("list --json", "list", "--json")
    p.do("status", "status", "par-j2")
    p.do("status --json", "status", "par-j2", "--json")
    p.do("jobs", "jobs")
    p.do("jobs --json", "jobs", "--json")
    # par-a is busy with par-j2: a third job there waits in the queue, where it is looked at,
    # held, released and cancelled before it could start
    p.do("run -d (queued)", "run", "-d", "--cluster", "par-a", "--name", "par-j3", "-y", ECHO)
    p.do("logs (queued)", "logs", "par-j3")
    p.do("hold", "hold", "par-j3")
    p.do("release", "release", "par-j3")
    p.do("cancel", "cancel", "par-j3")
    follow = p.cli.popen("logs", "par-j2", "-f")
    try:
        early = _first_line_with(follow, "napper rank 0", timeout=60)  # it follows the live job
        p.do("stop (job)", "stop", "par-j2", "-y")
        rest, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    p.got["logs -f (stopped)"] = subprocess.CompletedProcess(
        follow.args, follow.returncode, "".join(early) + rest, err)
    p.do("logs", "logs", "par-j1")
    p.do("logs -f", "logs", "par-j1", "-f")
    p.do("stop (cluster)", "stop", "par-b", "-y")
    p.do("list --all", "list", "--all")
    p.do("usage", "usage")
    p.do("usage --by job", "usage", "--by", "job", "--json")
    p.do("prices", "prices", "--gpu", "H100")
    p.do("plan", "plan", "--model", "llama3-8b", "--gpu", "H100", "--count", "8")
    p.do("pool list", "pool", "list", "--json")
    # last, as nothing before may see a team: here the machine's owner is an admin; through
    # the server alice is not, so each change (and each admin's list) is refused there
    p.do("admin user add", "admin", "user", "add", "par-bob", "--team", "ml")
    p.do("admin user list", "admin", "user", "list")
    p.do("admin quota set", "admin", "quota", "set", "ml", "cpu", "4")
    p.do("admin budget set", "admin", "budget", "set", "ml", "100")
    p.do("admin teams", "admin", "teams")
    p.do("admin audit", "admin", "audit")
    p.do("admin user remove", "admin", "user", "remove", "par-bob")
    if p.where == "server":  # they check this machine's own clusters: refused through a server
        p.do("doctor --cluster", "doctor", "--cluster", "par-a")
        p.do("bench allreduce", "bench", "allreduce", "--cluster", "par-a")
    p.do("logout", "logout")  # the very last: after it the CLI works on its own home


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Place]]:
    root = tmp_path_factory.mktemp("parity")
    local = Fleet(root / "local" / "home", root / "local" / "cwd", slots=2)
    srv = Fleet(root / "server" / "home", root / "server" / "cwd", slots=2)
    user = Fleet(root / "user" / "home", root / "user" / "cwd", slots=2)
    made: dict[str, Place] = {}
    served = serving(srv)
    try:
        url, _ = next(served)
        admin = caller(url, (srv.home / "admin-token").read_text().strip())
        status, got = admin("POST", "/api/v1/admin/users", {"name": USER, "team": "ml"})
        assert status == 200, got
        user.home.mkdir(parents=True)
        (user.home / "token").write_text(got["token"])
        logged = user("login", url, "--token-file", str(user.home / "token"))
        assert logged.returncode == 0, logged.stderr
        for where, p in (("local", Place("local", local, local)),
                         ("server", Place("server", user, srv))):
            scenario(p)
            made[where] = p
        yield made
    finally:
        left = local.cleanup()
        served.close()
        left += srv.cleanup() + user.cleanup()
        assert not left, f"processes left behind: {left}"


def _table_rows(text: str, name: str) -> list[str]:
    return [ln for ln in text.splitlines() if f" {name} " in f" {ln} "]


def _json(r: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(r.stdout)


Check = Callable[[subprocess.CompletedProcess[str], Place], None]


def _launched(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "Cluster par-a: 1 CPU slot" in r.stdout, r.stdout


def _launched_json(r: subprocess.CompletedProcess[str], p: Place) -> None:
    row = _json(r)
    assert (row["name"], row["status"], row["count"], row["topology"], row["health"]) == \
        ("par-b", "running", 1, "shared memory", "ok"), row
    assert len(row["devices"]) == 1 and row["user"] == (USER if p.where == "server" else None)


def _listed(r: subprocess.CompletedProcess[str], p: Place) -> None:
    for name in ("par-a", "par-b"):  # the topology and health columns, from the same row
        row = _table_rows(r.stdout, name)
        assert len(row) == 1 and "shared memory" in row[0] and " ok " in row[0] and \
            "running" in row[0], r.stdout
    assert "par-j2 (running)" in _table_rows(r.stdout, "par-a")[0], r.stdout


def _listed_json(r: subprocess.CompletedProcess[str], p: Place) -> None:
    rows = {c["name"]: c for c in _json(r)}
    assert set(rows) == {"par-a", "par-b"}, rows
    assert all(c["topology"] == "shared memory" and c["health"] == "ok" for c in rows.values()), \
        rows
    assert rows["par-a"]["devices"] != rows["par-b"]["devices"], rows  # one slot each
    assert (rows["par-a"]["job"], rows["par-a"]["job_status"]) == ("par-j2", "running"), rows


def _ran(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert '"argv": ["hello"]' in r.stdout, r.stdout  # the worker's own line, shown as it ran


def _detached(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "par-j2" in r.stdout and "started" in r.stdout and "gpufleet logs par-j2 -f" in \
        r.stdout, r.stdout


def _status(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "par-j2" in r.stdout and "running" in r.stdout, r.stdout


def _status_json(r: subprocess.CompletedProcess[str], p: Place) -> None:
    d = _json(r)
    assert (d["job"], d["cluster"], d["status"]) == ("par-j2", "par-a", "running"), d
    assert d["step"] >= 1 and d["cluster_info"]["job"] == "par-j2", d


def _jobs(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "succeeded" in _table_rows(r.stdout, "par-j1")[0], r.stdout
    assert "running" in _table_rows(r.stdout, "par-j2")[0], r.stdout


def _jobs_json(r: subprocess.CompletedProcess[str], p: Place) -> None:
    rows = {j["name"]: j["status"] for j in _json(r)}
    assert rows == {"par-j1": "succeeded", "par-j2": "running"}, rows


def _job_stopped(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "Job par-j2: stopped" in r.stdout, r.stdout


def _followed_to_its_end(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "napper rank 0" in r.stdout, r.stdout


def _logs(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert '"argv": ["hello"]' in r.stdout, r.stdout


def _cluster_stopped(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "Cluster par-b: stopped, devices freed, cost $" in r.stdout, r.stdout


def _queued(r: subprocess.CompletedProcess[str], p: Place) -> None:
    said = r.stdout + r.stderr  # the headline is on stderr, as every note around a job's output
    assert "par-j3" in said and "queued" in said, said


def _queued_logs(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "Job par-j3 is queued" in r.stderr and "its log starts when it runs" in r.stderr, \
        r.stderr
    assert r.stdout == "", r.stdout


def _said(*words: str) -> Check:
    def check(r: subprocess.CompletedProcess[str], p: Place) -> None:
        assert all(w in r.stdout for w in words), r.stdout
    return check


def _listed_all(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "stopped" in _table_rows(r.stdout, "par-b")[0], r.stdout
    assert "running" in _table_rows(r.stdout, "par-a")[0], r.stdout


def _usage(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "total" in r.stdout and "GPU-HOURS" in r.stdout, r.stdout


def _usage_by_job(r: subprocess.CompletedProcess[str], p: Place) -> None:
    booked = {g["job"]: g["micro_usd"] for g in _json(r)["groups"]}
    # the jobs that ran (par-j3 never did), and the clusters' idle time, billed to their owner
    assert {k for k in booked if not k.startswith("(idle) ")} == {"par-j1", "par-j2"}, booked
    assert "(idle) par-b" in booked and set(booked) <= {"par-j1", "par-j2", "(idle) par-a",
                                                        "(idle) par-b"}, booked
    assert all(v > 0 for v in booked.values()), booked


def _prices(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "H100-SXM" in r.stdout and "$ per GPU-hour" in r.stdout, r.stdout


def _planned(r: subprocess.CompletedProcess[str], p: Place) -> None:
    assert "llama3-8b: 8.03B parameters" in r.stdout and "8 x H100-SXM" in r.stdout, r.stdout
    assert "Memory per GPU" in r.stdout, r.stdout


def _pools(r: subprocess.CompletedProcess[str], p: Place) -> None:
    local = next(x for x in _json(r) if x["pool"] == "local")
    # par-a holds one of the two slots: the pool of the place that holds the clusters
    assert sum(n["free"] for n in local["nodes"]) == 1, local
    assert [h for n in local["nodes"] for h in n["held_by"]] == ["par-a"], local


def _refused(*words: str) -> Check:
    def check(r: subprocess.CompletedProcess[str], p: Place) -> None:
        assert len(error_lines(r.stderr)) == 1 and len(r.stderr.splitlines()) == 1, r.stderr
        assert all(w in r.stderr for w in words), r.stderr
    return check


def _admin(*words: str) -> Check:
    """An admin command: done on this machine (its owner is an admin), refused through the
    server (alice is not one) with one line naming the command."""
    def check(r: subprocess.CompletedProcess[str], p: Place) -> None:
        if p.where == "local":
            assert r.returncode == 0 and all(w in r.stdout for w in words), (r.stdout, r.stderr)
        else:
            assert r.returncode == 2, (r.stdout, r.stderr)
            _refused("only an admin may", USER)(r, p)
    return check


def _logged_out(r: subprocess.CompletedProcess[str], p: Place) -> None:
    if p.where == "local":
        assert "Not logged in to a server." in r.stderr and r.stdout == "", (r.stdout, r.stderr)
    else:
        assert "Logged out" in r.stdout and not (p.cli.home / "login.json").exists(), r.stdout


def _teams(r: subprocess.CompletedProcess[str], p: Place) -> None:
    # the machine's owner sees every team (par-bob's); alice her own, which has her in it
    assert "team ml:" in r.stdout and ("par-bob" if p.where == "local" else USER) in r.stdout, \
        r.stdout


# case -> (the places it runs in, expected exit code (None: the check judges it), what proves
# it worked)
CASES: dict[str, tuple[tuple[str, ...], int | None, Check]] = {
    "launch": (PLACES, 0, _launched),
    "launch --json": (PLACES, 0, _launched_json),
    "list": (PLACES, 0, _listed),
    "list --json": (PLACES, 0, _listed_json),
    "run": (PLACES, 0, _ran),
    "run -d": (PLACES, 0, _detached),
    "status": (PLACES, 0, _status),
    "status --json": (PLACES, 0, _status_json),
    "jobs": (PLACES, 0, _jobs),
    "jobs --json": (PLACES, 0, _jobs_json),
    "run -d (queued)": (PLACES, 0, _queued),
    "logs (queued)": (PLACES, 0, _queued_logs),
    "hold": (PLACES, 0, _said("par-j3", "held")),
    "release": (PLACES, 0, _said("par-j3", "released")),
    "cancel": (PLACES, 0, _said("par-j3", "cancelled")),
    "stop (job)": (PLACES, 0, _job_stopped),
    "logs -f (stopped)": (PLACES, 1, _followed_to_its_end),  # the job's outcome, as `run` gives
    "logs": (PLACES, 0, _logs),
    "logs -f": (PLACES, 0, _logs),
    "stop (cluster)": (PLACES, 0, _cluster_stopped),
    "list --all": (PLACES, 0, _listed_all),
    "usage": (PLACES, 0, _usage),
    "usage --by job": (PLACES, 0, _usage_by_job),
    "prices": (PLACES, 0, _prices),
    "plan": (PLACES, 0, _planned),
    "pool list": (PLACES, 0, _pools),
    "admin user add": (PLACES, None, _admin()),
    "admin user list": (PLACES, None, _admin("par-bob", "ml")),
    "admin quota set": (PLACES, None, _admin("team ml", "cpu: 0/4")),
    "admin budget set": (PLACES, None, _admin("team ml", "$100")),
    "admin teams": (PLACES, 0, _teams),
    "admin audit": (PLACES, None, _admin("quota", "par-bob")),
    "admin user remove": (PLACES, None, _admin("user par-bob removed")),
    "logout": (PLACES, 0, _logged_out),
    "doctor --cluster": (("server",), 2, _refused("cluster", "this machine")),
    "bench allreduce": (("server",), 2, _refused("cluster", "this machine")),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("where", PLACES)
def test_each_command_works_here_and_through_a_server(places: dict[str, Place], where: str,
                                                      case: str) -> None:
    runs_in, code, check = CASES[case]
    if where not in runs_in:
        pytest.skip(f"{case}: checked on this machine by its own module (test_doctor, "
                    "test_bench_calibration)")
    r = places[where].got[case]
    assert "Traceback" not in r.stderr, r.stderr  # the CLI's own; a job's output may have one
    assert code is None or r.returncode == code, \
        f"{case} ({where}): exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    check(r, places[where])


def test_a_cluster_row_has_one_shape_everywhere(places: dict[str, Place]) -> None:
    """`launch --json` and `list --json`, here and through the server, give the same keys in
    the same order: the one row `gpufleet.cluster_row` makes (the state-file reader's rows of
    stopped clusters are checked against it in tests/unit/test_snapshot.py)."""
    from gpufleet.cluster_row import KEYS

    shapes = {}
    for where, p in places.items():
        shapes[(where, "launch --json")] = tuple(_json(p.got["launch --json"]))
        for row in _json(p.got["list --json"]):
            shapes[(where, "list --json", row["name"])] = tuple(row)
    assert len(shapes) == 6 and set(shapes.values()) == {KEYS}, shapes



# Commands not in CASES, each with why: a command added later must be run both ways above or
# be named here (test_every_command_is_a_case).
NOT_CASES = {
    "show-gpus": "reads the GPU catalog only, as prices does",
    "ssh": "a shell on a node of this machine's own clusters (test_clusters)",
    "exec": "a command on a node of this machine's own clusters (test_clusters)",
    "dashboard": "serves this machine's state; the server has its own (test_server_dashboard)",
    "server": "is the server (every case through it runs against one)",
    "login": "connects the CLI to a server (the fixture logs in with it)",
    "pool add": "registers a pool of this machine (test_ray_pool, test_slurm_pool)",
    "pool up": "starts a Ray cluster on this machine (test_ray_pool)",
    "pool down": "stops it (test_ray_pool)",
    "pool remove": "forgets a pool of this machine (test_ray_pool)",
    "pool use": "sets this machine's default pool (test_ray_pool)",
    "bench scaling": "measures this machine's cluster, refused through a server as bench "
                     "allreduce is (test_bench_calibration)",
}


def _command_paths() -> set[str]:
    """Every command of the app, by its words (`pool list`, `admin user add`)."""
    import typer.main

    from gpufleet.cli import app

    def walk(cmd: Any, words: tuple[str, ...]) -> Iterator[str]:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield " ".join(words)
            return
        for name, sub in subs.items():
            if not getattr(sub, "hidden", False):
                yield from walk(sub, (*words, name))

    return set(walk(typer.main.get_command(app), ()))


def test_every_command_is_a_case() -> None:
    """A command runs here and through the server in CASES, or NOT_CASES says why not: one
    added later without either fails here, before anyone logs in to a server and finds it."""
    paths = _command_paths()
    assert {"launch", "pool list", "admin user add", "bench allreduce"} <= paths, paths

    def command_of(case: str) -> str:
        words = case.split()
        return next(" ".join(words[:n]) for n in range(len(words), 0, -1)
                    if " ".join(words[:n]) in paths)

    covered = {command_of(case) for case in CASES}
    assert paths - covered - set(NOT_CASES) == set(), "commands in neither CASES nor NOT_CASES"
    assert covered & set(NOT_CASES) == set() and set(NOT_CASES) <= paths
