"""The pure guards of adversarial findings 4, 5, 6 and 8: YAML anchors, bounded error
messages, a YAML `env` that is not a mapping, which state folder may be used, which state file
may be opened, and noticing the state file removed under a running job."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpufleet.cli.env_pairs import merged_env
from gpufleet.doctor.state_check import state_facts, state_file_check
from gpufleet.errors import SpecError
from gpufleet.home import FolderFacts, home_problem
from gpufleet.spec import JobSpec, load_yaml
from gpufleet.state_file import Facts, Kind, db_problem, open_problem
from gpufleet.supervise.store_watch import Identity, lost

BOMB = "a: &a [x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nstrategy: *b\n"


@pytest.mark.parametrize("text", [BOMB, "base: &b {gpu: cpu}\ncluster: *b\n", "x: &a 1\n"])
def test_yaml_anchors_and_aliases_are_refused(tmp_path: Path, text: str) -> None:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as info:
        load_yaml(p)
    assert info.value.problems == [
        ("file", f"{p}: YAML anchors and aliases (&, *) are not supported; write the values out")]


def test_error_messages_echo_an_excerpt_only() -> None:
    huge = "x" * 100_000
    with pytest.raises(SpecError) as info:
        JobSpec.parse({"script": "t.py", "cluster": "c", "strategy": [[huge] * 9] * 9,
                       "hang_timeout": huge + "\nsecond line", "name": huge})
    text = str(info.value)
    assert len(text) < 1000 and "\n" not in text
    assert "xxx..." in text


@pytest.mark.parametrize("env", ["A=1", 5, [[1, 2, 3]], [[1, 2]]])
def test_yaml_env_must_be_a_mapping(env: object) -> None:
    with pytest.raises(SpecError) as info:
        merged_env(env, [])
    [(field, msg)] = info.value.problems
    assert field == "env" and msg.startswith("must be a mapping of NAME: value")


def test_yaml_env_and_flags_merge_flags_winning() -> None:
    assert merged_env({"A": 1, "B": "x"}, ["B=y", "C=z=1"]) == {"A": 1, "B": "y", "C": "z=1"}
    assert merged_env(None, []) is None
    with pytest.raises(SpecError, match="'oops' is not NAME=VALUE"):
        merged_env(None, ["oops"])


HOME = Path("/srv/shared")


@pytest.mark.parametrize(("facts", "refused"), [
    (FolderFacts(exists=False), None),
    (FolderFacts(True, False, True, 0o700, 1000), None),
    (FolderFacts(True, False, True, 0o755, 1000), None),  # private enough: used as is
    (FolderFacts(True, False, True, 0o1777, 0), "can be written by other users (mode 1777)"),
    (FolderFacts(True, False, True, 0o770, 1000), "can be written by other users (mode 0770)"),
    (FolderFacts(True, True, False, 0o777, 0), "is a symbolic link of another user (uid 0)"),
    (FolderFacts(True, True, False, 0o777, 1000), "is a symbolic link to nothing"),
    (FolderFacts(True, False, True, 0o700, 0), "belongs to another user (uid 0)"),
    (FolderFacts(True, False, False, 0o600, 1000), "is not a folder"),
])
def test_which_state_folder_may_be_used(facts: FolderFacts, refused: str | None) -> None:
    problem = home_problem(HOME, facts, my_uid=1000)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(f"GPUFLEET_HOME: {HOME} ")
        assert refused in problem


def test_a_link_of_ones_own_is_judged_by_the_folder_it_points_to() -> None:
    link = FolderFacts(True, True, False, 0o777, 1000)
    private = FolderFacts(True, False, True, 0o700, 1000)
    assert home_problem(HOME, link, 1000, target=private) is None  # ~/.gpufleet on scratch
    shared = FolderFacts(True, False, True, 0o1777, 0)
    problem = home_problem(HOME, link, 1000, target=shared)
    assert problem is not None and "(a link to" in problem and "mode 1777" in problem


DB = Path("/h/state.db")


@pytest.mark.parametrize(("facts", "refused"), [
    (Facts(Kind.MISSING), None),  # a new store
    (Facts(Kind.FILE, 0), None),  # made a moment ago
    (Facts(Kind.FILE, 65536), None),
    (Facts(Kind.MISSING, side_files=("-wal", "-shm")), "is missing but state.db-wal and "
                                                       "state.db-shm are still there"),
    (Facts(Kind.MISSING, side_files=("-shm",)), "is missing but state.db-shm is still there"),
    (Facts(Kind.FILE, 0, ("-wal",)), "is empty but state.db-wal is still there"),
    (Facts(Kind.FOLDER), "is a folder, not a file"),
    (Facts(Kind.FILE, 42), "is not an SQLite database (42 bytes"),
])
def test_which_state_file_may_be_opened(facts: Facts, refused: str | None) -> None:
    problem = open_problem(DB, facts)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem and "\n" not in problem


def test_sqlite_errors_about_the_file_become_one_line() -> None:
    damaged = db_problem(DB, "SQLITE_NOTADB", "file is not a database")
    assert damaged is not None and "move it aside" in damaged and "gpufleet doctor" in damaged
    assert "writable" in (db_problem(DB, "SQLITE_READONLY_DBMOVED", "readonly") or "")
    assert db_problem(DB, "SQLITE_CONSTRAINT_UNIQUE", "UNIQUE constraint failed") is None


OPENED = Identity(dev=1, ino=10, size=65536)


@pytest.mark.parametrize(("now", "why"), [
    (OPENED, None),
    (Identity(1, 10, 131072), None),  # grown: still the store
    (None, "was removed"),
    (Identity(1, 11, 65536), "was replaced by another file"),
    (Identity(1, 10, 0), "was truncated (0 bytes)"),
])
def test_store_identity_under_a_running_job(now: Identity | None, why: str | None) -> None:
    got = lost(DB, OPENED, now)
    assert got is None if why is None else (got is not None and why in got)


def test_doctor_names_a_damaged_state_file(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE t (x)")
        c.executemany("INSERT INTO t VALUES (?)", [(str(i) * 50,) for i in range(2000)])
    c.close()
    assert state_file_check(state_facts(db)).status == "pass"
    with open(db, "r+b") as f:  # an overwritten page: the header is intact
        f.seek(8192)
        f.write(b"\xff" * 8192)
    check = state_file_check(state_facts(db))
    assert check.status == "fail" and "damaged" in check.detail and f"mv {db}" in check.fix
    db.write_bytes(b"garbage" * 100)
    check = state_file_check(state_facts(db))
    assert check.status == "fail" and "not a database" in check.detail
    assert state_file_check(state_facts(tmp_path / "absent.db")).status == "pass"
