"""A run's environment, assembled in one place: the supervisor's, and its workers'.

Three processes see a job's environment: the supervisor (`lifecycle.runs.start_detached`
starts it, from the submitting shell's environment), the worker group (what the supervisor
passes to the backend's `start`) and `run --dry-run` (which shows the workers' without
starting anything). Each layer's rule lives here once:

- the state a supervisor records to is always the starting process's (`STATE_VARS`), and a
  CLI's server and token (`CLIENT_VARS`) are no business of a supervisor or a worker;
- the workers get neither the database URL (the server's password) nor the CLI's server;
- gpufleet adds, over the caller's: the backend's variables (`Prepared.env`: devices, threads,
  rendezvous), the survive variables (`survive_env`: checkpoints, control file, run number,
  gradient accumulation), the run's identity (`identity_env`, which ends a dead run's
  leftovers), then the job's own `env`, then the report key last (`workers_env`).

Pure: environments in, an environment out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpufleet.launch.torchrun import merge_env
from gpufleet.launch.warm_restart import RESTART_FILE_VAR
from gpufleet.reportauth import KEY_ENV

STATE_VARS = ("GPUFLEET_HOME", "GPUFLEET_DB")  # where the store is: the starter's, always
CLIENT_VARS = ("GPUFLEET_SERVER", "GPUFLEET_TOKEN")  # a CLI's team server and its token
# the server's database URL (its password) and a CLI's server and token: not the workers'
# business; nor a warm launcher's restart file (a job started from inside a rank gets its own,
# or none: launch/warm_restart.py)
NOT_FOR_WORKERS = ("GPUFLEET_DB", *CLIENT_VARS, RESTART_FILE_VAR)
CPU_SLOTS_VAR = "GPUFLEET_CPU_SLOTS"
SUPERVISOR_VAR = "GPUFLEET_SUPERVISOR_PID"


def supervisor_env(caller: Mapping[str, str], here: Mapping[str, str],
                   cpu_slots: int | None = None) -> dict[str, str]:
    """The environment a detached supervisor starts with: the `caller`'s (a queued job's
    submitting shell, or this process's), with the state folder and database of `here` (the
    process that starts it; unset there, unset for the supervisor), no CLI server or token, and
    the pool's CPU slots as the caller saw them (`cpu_slots`, for an elastic job growing)."""
    env = {k: v for k, v in caller.items() if k not in STATE_VARS and k not in CLIENT_VARS}
    env.update({k: here[k] for k in STATE_VARS if k in here})
    if cpu_slots is not None:
        env[CPU_SLOTS_VAR] = str(cpu_slots)
    return env


def survive_env(job_dir: Path, run: int, checkpoint_to: str | None,
                grad_accum: int | None) -> dict[str, str]:
    """Where checkpoints go and how the supervisor asks for one, for `train.Checkpointer`; the
    run's number; an elastic job's micro-batches per optimizer step at this size."""
    env = {"GPUFLEET_CHECKPOINT_DIR": str(job_dir / "checkpoints"),
           "GPUFLEET_CONTROL_FILE": str(job_dir / "control.json"),
           "GPUFLEET_RUN": str(run)}
    if checkpoint_to:
        env["GPUFLEET_CHECKPOINT_TO"] = checkpoint_to
    if grad_accum is not None:
        env["GPUFLEET_GRAD_ACCUM"] = str(grad_accum)
    return env


def identity_env(job_name: str, job_dir: str, supervisor_pid: int) -> dict[str, str]:
    """Who started the run, in every process of it: what `lifecycle.leftovers.belongs` looks
    for, so a reconcile ends this supervisor's leftovers and never a resumed run's."""
    return {"GPUFLEET_JOB": job_name, "GPUFLEET_JOB_DIR": job_dir,
            SUPERVISOR_VAR: str(supervisor_pid)}


def worker_env(caller: Mapping[str, str], gpufleet: dict[str, str],
               user: dict[str, str]) -> dict[str, str]:
    """The environment a job's worker group starts with, from the environment of the process
    that starts it (`caller`), what gpufleet adds and the job's own `user` variables: what the
    supervisor passes to the backend's `start` (through `workers_env`), and what `run --dry-run`
    shows, so the two cannot differ."""
    return merge_env({k: v for k, v in caller.items() if k not in NOT_FOR_WORKERS}, gpufleet, user)


def workers_env(caller: Mapping[str, str], backend: dict[str, str], survive: dict[str, str],
                identity: dict[str, str], user: dict[str, str],
                report_key: str) -> dict[str, str]:
    """One run's whole worker environment: `worker_env` over the backend's, survive and
    identity variables, and the report key after the user's (never in `command.json`, a log
    or the store)."""
    env = worker_env(caller, {**backend, **survive, **identity}, user)
    env[KEY_ENV] = report_key
    return env
