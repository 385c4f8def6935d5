"""A restart inside the running launcher, without processes: the line the launcher waits with,
what the supervisor writes for it and what a forked rank takes from it (the real launcher,
forkserver and restarts run in tests/integration/test_warm_workers.py)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.launch import warm_restart as wr
from gpufleet.reportauth import KEY_ENV


def test_the_waiting_line_carries_the_exit_code_and_nothing_else_reads_as_one() -> None:
    assert wr.parked_code(wr.parked_line(1, 3)) == 1
    assert wr.parked_code(wr.parked_line(-9, 1)) == -9
    assert wr.parked_code("gpufleet: the workers ended") is None
    assert wr.parked_code("[rank1]: print('" + wr.PARKED + "')") is None  # no code: not one


def test_only_what_changed_goes_in_the_file_and_never_the_report_key() -> None:
    assert wr.NEVER_IN_FILE == (KEY_ENV,)
    started = {"GPUFLEET_RUN": "1", "A": "x", KEY_ENV: "k1"}
    now = {"GPUFLEET_RUN": "2", "A": "x", "B": "new", KEY_ENV: "k2"}
    assert wr.env_change(started, now) == {"GPUFLEET_RUN": "2", "B": "new"}


def test_a_rank_takes_the_files_variables_only_for_a_later_run(tmp_path: Path) -> None:
    path = tmp_path / "restart.json"
    env = {wr.RESTART_FILE_VAR: str(path), wr.RUN_VAR: "1"}
    assert wr.rank_env(env) == {}  # no file yet: the first run
    wr.write(path, 2, {"GPUFLEET_RUN": "2"})
    assert wr.read(path) == wr.Decision(2, {"GPUFLEET_RUN": "2"})
    assert wr.rank_env(env) == {"GPUFLEET_RUN": "2"}
    assert wr.rank_env({**env, wr.RUN_VAR: "2"}) == {}  # a launcher started for run 2
    assert wr.rank_env({wr.RUN_VAR: "1"}) == {}  # a launcher not offered restarts in place
    path.write_text("{not json")
    assert wr.read(path) is None and wr.rank_env(env) == {}
    assert not list(tmp_path.glob("*.tmp"))


def test_the_launcher_waits_for_a_later_run_or_until_its_parent_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "restart.json"
    wr.write(path, 1, {})  # an earlier decision: not the one waited for
    parents = iter([10, 10, 10, 1])
    assert wr.wait_for(path, 1, 10, ppid=lambda: next(parents)) is None
    calls = {"n": 0}

    def parent() -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            wr.write(path, 2, {"GPUFLEET_RUN": "2"})
        return 10

    assert wr.wait_for(path, 1, 10, ppid=parent) == wr.Decision(2, {"GPUFLEET_RUN": "2"})
    wr.write_end(path, 1)  # the supervisor gave up: no rank takes anything from it
    assert wr.wait_for(path, 2, 10, ppid=lambda: 10) == wr.Decision(0, {}, end=1)
    assert wr.rank_env({wr.RESTART_FILE_VAR: str(path), wr.RUN_VAR: "1"}) == {}
    wr.write_end(path, 1, over=True)  # the job ends with it: the nodes let its copies go
    assert wr.read(path) == wr.Decision(0, {}, end=1, over=True)
