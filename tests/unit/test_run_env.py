"""A run's environment, assembled in `launch.run_env` only: the detached supervisor's (what
`runs.start_detached` starts it with) and the workers' (what the supervisor starts them with).
Pure functions, plain dicts."""

from __future__ import annotations

from pathlib import Path

from gpufleet.launch.run_env import (
    NOT_FOR_WORKERS,
    SUPERVISOR_VAR,
    identity_env,
    supervisor_env,
    survive_env,
    worker_env,
    workers_env,
)
from gpufleet.lifecycle.leftovers import RunIdentity, belongs
from gpufleet.reportauth import KEY_ENV

SHELL = {"PATH": "/usr/bin", "GPUFLEET_HOME": "/shell/home", "GPUFLEET_DB": "postgresql://shell",
         "GPUFLEET_SERVER": "http://team:8000", "GPUFLEET_TOKEN": "tok", "OMP_NUM_THREADS": "4"}


def test_a_supervisor_records_to_the_starters_state_and_never_to_a_cli_server() -> None:
    here = {"GPUFLEET_HOME": "/server/home", "GPUFLEET_DB": "postgresql://server"}
    env = supervisor_env(SHELL, here, cpu_slots=6)
    assert env == {"PATH": "/usr/bin", "OMP_NUM_THREADS": "4", "GPUFLEET_HOME": "/server/home",
                   "GPUFLEET_DB": "postgresql://server", "GPUFLEET_CPU_SLOTS": "6"}
    # unset where it starts: unset for the supervisor too, whatever the submitting shell had
    assert supervisor_env(SHELL, {}) == {"PATH": "/usr/bin", "OMP_NUM_THREADS": "4"}


def test_survive_env_names_the_run_and_only_what_the_job_asks_for() -> None:
    job_dir = Path("/jobs/j")
    plain = survive_env(job_dir, 3, None, None)
    assert plain == {"GPUFLEET_CHECKPOINT_DIR": "/jobs/j/checkpoints",
                     "GPUFLEET_CONTROL_FILE": "/jobs/j/control.json", "GPUFLEET_RUN": "3"}
    elastic = survive_env(job_dir, 4, "s3://b/j", 2)
    assert elastic == {**plain, "GPUFLEET_RUN": "4", "GPUFLEET_CHECKPOINT_TO": "s3://b/j",
                       "GPUFLEET_GRAD_ACCUM": "2"}


def test_the_workers_get_every_layer_the_identity_and_the_key_last() -> None:
    backend = {"CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "8", "GPUFLEET_WORKERS": "2"}
    survive = survive_env(Path("/jobs/j"), 1, None, None)
    mine = identity_env("j", "/jobs/j", 4242)
    user = {"FOO": "bar", KEY_ENV: "the user's"}
    env = workers_env(SHELL, backend, survive, mine, user, "k3y")
    assert env == {**worker_env(SHELL, {**backend, **survive, **mine}, user), KEY_ENV: "k3y"}
    assert not set(NOT_FOR_WORKERS) & set(env)  # no database URL, no CLI server or token
    assert env["GPUFLEET_HOME"] == "/shell/home" and env["OMP_NUM_THREADS"] == "4"  # the shell's
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["FOO"] == "bar"
    assert env[SUPERVISOR_VAR] == "4242"
    # and a reconcile finds the run by exactly that identity, not another supervisor's
    assert belongs(env, RunIdentity("j", "/jobs/j", 4242))
    assert not belongs(env, RunIdentity("j", "/jobs/j", 4243))
