"""Bad input through the real CLI: one `error:` line naming the field, exit code 2, no traceback,
and nothing left behind: no record in the state file, no folder, no process."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fleet_helpers import WORKERS, Fleet, error_lines

WORKER = str(WORKERS / "argv_echo.py")
LAUNCH = ("launch", "--gpu")
# written into the command's folder before each case
FILES = {"bad.yaml": "gpu: cpu\ncount: [2\nname: dev\n"}

# (id, argv, field named in the error, a hint the message must hold)
CASES = [
    ("unknown-gpu", [*LAUNCH, "H10", "-y"], "gpu", "did you mean"),
    ("mixed-gpus", [*LAUNCH, "H100,A100", "-y"], "gpu", "mixed"),
    ("count-129", [*LAUNCH, "cpu", "--count", "129", "-y"], "count", "128"),
    ("count-0", [*LAUNCH, "cpu", "--count", "0", "-y"], "count", "at least 1"),
    ("per-node-limit", [*LAUNCH, "H100", "--count", "16", "-y"], "count", "per node"),
    ("nvswitch-2-nodes", [*LAUNCH, "H100", "--count", "16", "--network", "nvswitch", "--nodes", "2",
                          "-y"], "network", "nvswitch"),
    ("bad-name", [*LAUNCH, "cpu", "--name", "Bad_Name", "-y"], "name", "Bad_Name"),
    ("duplicate-name", [*LAUNCH, "cpu", "--name", "dup", "-y"], "name", "already exists"),
    ("bad-disk", [*LAUNCH, "cpu", "--disk", "12XB", "-y"], "disk", "12XB"),
    ("disk-too-big", [*LAUNCH, "cpu", "--disk", "999PB", "-y"], "disk", "free"),
    ("unknown-price-book", [*LAUNCH, "cpu", "--price-book", "nope", "-y"], "price_book", "nope"),
    ("unknown-strategy", ["run", "--gpu", "cpu", "--count", "1", "--strategy", "zero9", "-y", WORKER],
     "strategy", "zero9"),
    ("missing-script", ["run", "--gpu", "cpu", "--count", "1", "-y", "no_such_script.py"], "script",
     "no_such_script.py"),
    ("unknown-cluster", ["run", "--cluster", "ghost", "-y", WORKER], "cluster", "ghost"),
    ("cluster-and-gpu", ["run", "--cluster", "dup", "--gpu", "cpu", "-y", WORKER], "cluster", "not both"),
    ("bad-env", ["run", "--cluster", "dup", "-e", "NOEQUALS", "-y", WORKER], "env", "NOEQUALS"),
    ("exec-unknown-cluster", ["exec", "ghost", "--", "true"], "cluster", "ghost"),
    ("logs-unknown-job", ["logs", "ghost"], "job", "ghost"),
    ("stop-unknown-name", ["stop", "ghost"], "name", "ghost"),
    ("status-unknown-job", ["status", "ghost", "--json"], "job", "ghost"),
    ("env-pins-devices", ["run", "--cluster", "dup", "-e", "CUDA_VISIBLE_DEVICES=0", "-y", WORKER],
     "env", "CUDA_VISIBLE_DEVICES"),
    ("too-many-workers", ["run", "--gpu", "cpu", "--count", "1", "--workers-per-node", "2", "-y",
                          WORKER], "workers_per_node", "1 to 1"),
    ("yaml-is-a-folder", [*LAUNCH, "cpu", "-f", ".", "-y"], "file", "cannot read"),
    ("exec-not-executable", ["exec", "dup", "--", "/etc/hostname"], "command", "cannot run"),
    # a YAML mistake says where it is
    ("yaml-invalid", [*LAUNCH, "cpu", "-f", "bad.yaml", "-y"], "file",
     "line 3, column 5: expected ',' or ']', but got ':' (in a flow sequence that starts at line 2"),
    # command-line mistakes are one line too, with the option meant
    ("unknown-option", [*LAUNCH, "cpu", "--cuont", "2", "-y"], "--cuont", "did you mean --count?"),
    ("unknown-command", ["lanch", "--gpu", "cpu"], "command", "did you mean launch?"),
    ("missing-option", ["bench", "allreduce"], "--cluster", "is required"),
    ("script-option-before-dashes", ["run", "--gpu", "cpu", "-y", WORKER, "--epochs", "3"],
     "--epochs", "go after a --, e.g. -- --epochs"),
    # CPU slots: what this host offers, and how to offer more
    ("cpu-slots-beyond-host", [*LAUNCH, "cpu", "--count", "99", "-y"], "count",
     "99 CPU slots asked for, but this host offers 2; offer more with --cpu-slots 99"),
    ("run-cpu-slots-beyond-host", ["run", "--gpu", "cpu", "--count", "5", "-y", WORKER], "count",
     "this host offers 2; offer more with --cpu-slots 5"),
    ("script-is-a-directory", ["run", "--gpu", "cpu", "-y", str(WORKERS)], "script",
     f"{WORKERS} is a directory, not a script"),
]


@pytest.mark.parametrize(("argv", "field", "hint"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_error(fleet: Fleet, argv: list[str], field: str, hint: str) -> None:
    for name, text in FILES.items():
        (fleet.cwd / name).write_text(text)
    if "dup" in argv:
        fleet.ok("launch", "--gpu", "cpu", "--name", "dup", "-y")
    before = _left(fleet.home)
    r = fleet(*argv)
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr + r.stdout
    assert r.stderr.splitlines() == error_lines(r.stderr), "the error line and nothing else"
    [line] = error_lines(r.stderr)
    assert line.startswith(f"error: {field}: "), line
    assert hint.lower() in line.lower(), line
    assert r.stdout == "", "a refused command prints nothing on stdout"
    assert "Quote" not in r.stderr, "refused before a quote is shown"
    assert _left(fleet.home) == before, "the refused command left something in the state folder"
    assert sorted(p.name for p in fleet.cwd.iterdir()) == sorted(FILES)


def _left(home: Path) -> dict[str, object]:
    """What the state folder holds: records of every kind a command makes, and the files under
    its cluster and job folders (processes are checked by the `fleet` fixture)."""
    tables = ("clusters", "reservations", "jobs", "queue", "job_events")
    found: dict[str, object] = dict.fromkeys(tables, 0)  # no state file yet: no records
    if (home / "state.db").exists():
        with sqlite3.connect(home / "state.db") as db:
            for table in tables:
                found[table] = db.execute(f"select count(*) from {table}").fetchone()[0]
    for folder in ("clusters", "jobs"):
        found[folder] = sorted(str(p.relative_to(home)) for p in (home / folder).rglob("*")) \
            if (home / folder).exists() else []
    return found


def _reservations(home: Path) -> int:
    with sqlite3.connect(home / "state.db") as db:
        return db.execute("select count(*) from reservations").fetchone()[0]


def test_refused_requests_leave_nothing_behind(fleet: Fleet) -> None:
    refused = [
        [*LAUNCH, "cpu", "--disk", "999PB", "--name", "huge", "-y"],
        [*LAUNCH, "cpu", "--count", "16", "-y"],
        [*LAUNCH, "H10", "-y"],
        [*LAUNCH, "cpu", "--count", "3", "-y"],  # 2 slots
        ["run", "--gpu", "cpu", "--count", "1", "--strategy", "zero9", "-y", WORKER],
        ["run", "--gpu", "cpu", "--count", "3", "-y", WORKER],
    ]
    for argv in refused:
        r = fleet(*argv)
        assert r.returncode == 2, (argv, r.stderr)
    assert fleet.clusters(all_=True) == []
    assert _reservations(fleet.home) == 0
    assert not (fleet.home / "clusters" / "huge").exists()
    assert not (fleet.home / "jobs").exists() or not any((fleet.home / "jobs").iterdir())

    # a refusal for lack of devices does not disturb the cluster that holds them
    fleet.ok("launch", "--gpu", "cpu", "--count", "2", "--name", "held", "-y")
    r = fleet("launch", "--gpu", "cpu", "--count", "1", "--name", "more", "-y")
    assert r.returncode == 2
    assert [c["name"] for c in fleet.clusters(all_=True)] == ["held"]
    assert _reservations(fleet.home) == 2
    assert not (fleet.home / "clusters" / "more").exists()


def test_a_detached_run_whose_supervisor_cannot_start_fails_and_frees_its_cluster(
        fleet: Fleet) -> None:
    """`run -d` starts the supervisor through `runs.start_detached`, which fails the job and
    frees the cluster made for it when the start fails (here: its log is a folder)."""
    (fleet.home / "jobs" / "nolog" / "supervisor.log").mkdir(parents=True)
    r = fleet("run", "-d", "--gpu", "cpu", "--count", "1", "--name", "nolog", "-y", WORKER)
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr + r.stdout
    [line] = error_lines(r.stderr)
    assert line.startswith("error: job nolog: its supervisor could not start: "), line
    with sqlite3.connect(fleet.home / "state.db") as db:
        status, reason = db.execute(
            "select status, reason from jobs where name = 'nolog'").fetchone()
    assert status == "failed" and reason == line.removeprefix("error: job nolog: ")
    assert _reservations(fleet.home) == 0
    assert [c["status"] for c in fleet.clusters(all_=True)] == ["stopped"]
