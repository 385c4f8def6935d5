"""Adversarial findings 4, 5, 6 and 8 through the real CLI: a YAML alias bomb and a YAML `env`
of the wrong type, a shared or linked GPUFLEET_HOME, and a state file that is damaged, in the
way, read-only, or removed under a running job. Each is one line and exit code 2 (the job:
ended and reported), and nothing is left behind or re-created empty."""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
from fleet_helpers import CLI, WORKERS, Fleet, error_lines

from gpufleet.store import Store
from gpufleet.web.app import create_app

# 419 bytes that expanded to 34.7 MB in an error message (9 levels: about 20 GB).
BOMB = "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdef", "bcdefg", strict=True))


def test_yaml_alias_bomb_and_env_of_the_wrong_type(fleet: Fleet) -> None:
    job = fleet.cwd / "job.yaml"
    job.write_text("a: &a [xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx, x]\n" + BOMB
                   + "strategy: *g\nscript: job.yaml\ncluster: {gpu: cpu, count: 1}\n")
    r = fleet("run", "-f", str(job), "-y", timeout=30)
    assert r.returncode == 2 and len(r.stderr) < 1024, r.stderr[:2000]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert error_lines(r.stderr) == [f"error: file: {job}: YAML anchors and aliases (&, *) are "
                                     "not supported; write the values out"]
    for env in ('"A=1"', "5", "[[1, 2, 3]]"):
        job.write_text(f"script: job.yaml\ncluster: {{gpu: cpu, count: 1}}\nenv: {env}\n")
        r = fleet("run", "-f", str(job), "-y")
        assert r.returncode == 2, r.stderr
        [line] = error_lines(r.stderr)
        assert line.startswith("error: env: must be a mapping of NAME: value"), line
        assert "Traceback" not in r.stderr
    assert fleet.clusters() == []  # nothing half-done


def test_shared_or_linked_home_is_refused_and_left_as_it_was(fleet: Fleet, tmp_path: Path) -> None:
    shared = tmp_path / "x-1777"
    shared.mkdir()
    shared.chmod(0o1777)
    link = tmp_path / "link"
    link.symlink_to(shared, target_is_directory=True)
    (fleet.home.parent / "elsewhere").mkdir(mode=0o700)
    for home, why in ((shared, "can be written by other users (mode 1777)"),
                      (link, "(a link to")):
        for args in (("list",), ("launch", "--gpu", "cpu", "--count", "1", "-y")):
            r = fleet(*args, env={"GPUFLEET_HOME": str(home)})
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            [line] = error_lines(r.stderr)
            assert line.startswith(f"error: GPUFLEET_HOME: {home} ") and why in line, line
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777 and list(shared.iterdir()) == []
    # a link of one's own to a private folder (~/.gpufleet on a scratch disk) is used
    mine = tmp_path / "mine"
    mine.symlink_to(fleet.home.parent / "elsewhere", target_is_directory=True)
    assert fleet("list", "--json", env={"GPUFLEET_HOME": str(mine)}).returncode == 0
    assert (fleet.home.parent / "elsewhere" / "state.db").exists()
    assert stat.S_IMODE((fleet.home.parent / "elsewhere").stat().st_mode) == 0o700
    fresh = tmp_path / "new" / "home"
    fleet("list", env={"GPUFLEET_HOME": str(fresh)})
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700


def _no_dac_override() -> None:
    """Drop CAP_DAC_OVERRIDE (root writes a read-only file otherwise): PR_CAPBSET_DROP."""
    if ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_damaged_store_is_one_line_from_every_command(fleet: Fleet) -> None:
    fleet.ok("launch", "--gpu", "cpu", "--count", "1", "--name", "c1", "-y")
    fleet.ok("stop", "c1", "-y")
    db = fleet.home / "state.db"
    good = db.read_bytes()
    commands = (("list",), ("status", "j"), ("launch", "--gpu", "cpu", "--count", "1", "-y"),
                ("dashboard", "--port", "0"))
    db.write_bytes(os.urandom(8192))
    for args in commands:
        r = fleet(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        [line] = error_lines(r.stderr)
        assert f"the state file {db} cannot be read (file is not a database)" in line, line
        assert "gpufleet doctor" in line
    db.unlink()
    db.mkdir()
    r = fleet("list")
    assert r.returncode == 2 and f"{db} is a folder, not a file" in r.stderr, r.stderr
    db.rmdir()
    db.write_bytes(good)
    db.chmod(0o400)
    r = subprocess.run([*CLI, "launch", "--gpu", "cpu", "--count", "1", "-y"], env=fleet.env(),
                       cwd=fleet.cwd, capture_output=True, text=True, timeout=60,
                       preexec_fn=_no_dac_override if os.geteuid() == 0 else None)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"the state file {db} cannot be opened for writing" in r.stderr, r.stderr
    db.chmod(0o600)


def test_dashboard_api_answers_503_for_a_damaged_store(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    store = Store()
    try:
        client = TestClient(create_app(store), base_url="http://127.0.0.1")
        assert client.get("/api/clusters").status_code == 200
        store.engine.dispose()  # as a server started before the damage: the file read anew
        (tmp_path / "home" / "state.db").write_bytes(b"\x00garbage" * 1000)
        for path in ("/api/clusters", "/api/jobs", "/metrics"):
            r = client.get(path)
            assert r.status_code == 503, (path, r.text[:500])
            assert "cannot be read" in r.json()["error"]
    finally:
        store.close()


def test_store_removed_under_a_running_job(fleet: Fleet) -> None:
    fleet.ok("run", str(WORKERS / "sleeper.py"), "--gpu", "cpu", "--count", "1", "--name", "sl",
             "--detach", "-y")
    fleet.wait_for_step("sl", 1)
    (fleet.home / "state.db").unlink()
    log = fleet.home / "jobs" / "sl" / "supervisor.log"
    deadline = time.monotonic() + 30  # noticed within EVERY_S (1 s); the margin is the machine's
    while "was removed while the job ran" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)
    assert "was removed while the job ran" in (fleet.home / "jobs" / "sl" / "job.log").read_text()
    r = fleet("list")  # not an empty store: the removal is named
    assert r.returncode == 2, r.stdout
    [line] = error_lines(r.stderr)
    assert f"the state file {fleet.home / 'state.db'} is missing but state.db-wal" in line, line
    assert not (fleet.home / "state.db").exists()  # never re-created empty
    # the fixture checks that the supervisor, torchrun and the worker are all gone
