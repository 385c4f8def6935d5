"""The pure parts of ending a job's processes: the keeper's view of its tree, and which
processes `reconcile` ends as a dead supervisor's leftovers."""

from __future__ import annotations

from gpufleet.backends.keeper import descendants, parent_of
from gpufleet.launch.run_env import identity_env
from gpufleet.lifecycle.leftovers import ProcessInfo, RunIdentity, belongs, of_run

RUN = RunIdentity("train-1a2b", "/home/u/.gpufleet/jobs/train-1a2b", 4242)


def test_descendants_follow_every_level_and_nothing_else() -> None:
    # keeper 10 -> torchrun 11 -> workers 12, 13 (13 has a child 14); an orphan 15 re-parented
    # to the keeper; 20 and 21 belong to someone else; 1 is init
    parents = {10: 1, 11: 10, 12: 11, 13: 11, 14: 13, 15: 10, 20: 1, 21: 20}
    assert descendants(parents, 10) == [11, 15, 12, 13, 14]
    assert descendants(parents, 14) == []
    assert descendants({5: 6, 6: 5}, 5) == [6]  # a cycle (a pid reused mid-scan) ends


def test_parent_of_reads_past_a_command_with_spaces_and_parentheses() -> None:
    assert parent_of("4321 (python) S 77 4321 4321 0 -1 4194560") == 77
    assert parent_of("99 (a (b) c) R 1 99 99 0") == 1


def test_of_run_takes_only_the_runs_own_processes() -> None:
    env = identity_env(RUN.job_name, RUN.job_dir, RUN.supervisor_pid)
    procs = [
        ProcessInfo(100, 1000, {**env, "RANK": "0"}),  # a worker
        ProcessInfo(101, 1000, env),  # torchrun
        ProcessInfo(102, 0, env),  # same identity, another user: not ours to end
        ProcessInfo(103, 1000, {**env, "GPUFLEET_SUPERVISOR_PID": "5151"}),  # a resumed run
        ProcessInfo(104, 1000, {**env, "GPUFLEET_JOB_DIR": "/elsewhere/jobs/train-1a2b"}),
        ProcessInfo(105, 1000, {**env, "GPUFLEET_JOB": "train-ffff"}),
        ProcessInfo(106, 1000, {"GPUFLEET_JOB_DIR": RUN.job_dir}),  # started outside gpufleet
        ProcessInfo(107, 1000, env),  # the caller itself
        ProcessInfo(108, 1000, {}),
    ]
    assert of_run(procs, RUN, uid=1000, me=107) == [100, 101]


def test_belongs_needs_every_part_of_the_identity() -> None:
    env = identity_env(RUN.job_name, RUN.job_dir, RUN.supervisor_pid)
    assert belongs(env, RUN)
    for key in env:
        assert not belongs({k: v for k, v in env.items() if k != key}, RUN), key
