"""Restarts inside the running launcher: a warm launcher whose workers failed waits for the
supervisor's decision instead of ending, and starts the next run's workers itself.

A restart through a fresh launcher pays for a new Python, torch imported again in the
launcher and its forkserver, and a new rendezvous store; about 2 s of the 3-5 s from a rank's
death to the next first step measured here (bench/recovery.py). The decision stays the
supervisor's (`supervise/machine.py`: the same events, backoff and same-failure rules as a
fresh start); only the way the next run starts changes:

1. torch's elastic agent sees a failed worker group. In place of ending (or its own
   `--max-restarts`, which would restart without asking), the patched `_restart_workers` stops
   the other workers, prints torchrun's own failure summary (what the supervisor reads the
   failing rank and its error file from) and then the `PARKED` line with the exit code the
   launcher would have ended with.
2. The supervisor reads that line from the launcher's output, after every line the workers
   printed before they died (one pipe keeps the order), and steps its machine as for an exit.
3. To restart, it writes `restart.json` (`write`): the run's number and the variables that
   differ from the launcher's own (GPUFLEET_RUN at least; never the report key). The launcher
   sees it (`wait_for`), rendezvouses again and forks the next run's workers, which apply
   those variables first thing (`rank_env`, from `warm_rank.run`).
4. To give up, it writes an end (`write_end`): the launcher ends with the exit code it named,
   as plain torchrun would have. To start differently (a resize, another command), it ends the
   launcher as before. A launcher whose parent went away ends by itself.

The local pool offers this with the file where the supervisor writes it; a multi-node run's
nodes with a file of each node's own, which the run's driver writes the supervisor's decision
into (backends/node_restart.py). `GPUFLEET_RESTART_FILE` unset means the launcher ends on a
failure, as plain torchrun does.
Importable without torch: the supervisor reads `PARKED` and `write` from here.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.reportauth import KEY_ENV

RESTART_FILE_VAR = "GPUFLEET_RESTART_FILE"
RUN_VAR = "GPUFLEET_RUN"
OWN_STORE_VAR = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # "1": no agent store kept across runs
PARKED = "gpufleet: the workers ended; the launcher waits for the supervisor"
_PARKED_RE = re.compile(re.escape(PARKED) + r" \(exit code (-?\d+), run (\d+)\)")
NEVER_IN_FILE = (KEY_ENV,)  # the report key reaches ranks through environments only
POLL_S = 0.01


def parked_line(code: int, run: int) -> str:
    return f"{PARKED} (exit code {code}, run {run})"


def parked_code(line: str) -> int | None:
    """The exit code in a launcher's `PARKED` line; None for any other line."""
    m = _PARKED_RE.search(line)
    return int(m.group(1)) if m else None


def parked_run(line: str) -> int:
    """The run number in a launcher's `PARKED` line; 0 for any other line."""
    m = _PARKED_RE.search(line)
    return int(m.group(2)) if m else 0


def env_change(started: Mapping[str, str], now: Mapping[str, str]) -> dict[str, str]:
    """The variables of the next run that differ from those the launcher started with (pure);
    the report key never (it is the same for the supervisor's life, and never in a file)."""
    return {k: v for k, v in now.items() if started.get(k) != v and k not in NEVER_IN_FILE}


@dataclass(frozen=True)
class Decision:
    """What the supervisor asked of a waiting launcher: start run `run` with `env` on top of
    its own variables, or (`end`, an exit code) end as plain torchrun would have."""

    run: int
    env: dict[str, str] = field(default_factory=dict)
    end: int | None = None
    # with `end`: the job is over (stopped, or no restart left), not about to start anew (a
    # resize, new launchers): a multi-node run's nodes let the job's workdir copies go
    over: bool = False


def write(path: Path, run: int, env: Mapping[str, str]) -> None:
    """The supervisor's decision to restart, as run `run` with `env`."""
    _write(path, {"run": run, "env": dict(env)})


def write_end(path: Path, code: int, over: bool = False) -> None:
    """The supervisor's decision to end the waiting launcher: it ends with `code`, quietly
    (killed, it would print a traceback of its own after the workers' failure); `over`: the
    job ends with it (Decision.over)."""
    _write(path, {"run": 0, "env": {}, "end": code, "over": over})


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp")  # atomic: the launcher never reads half a file
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read(path: Path) -> Decision | None:
    """The decision in a restart file; None when there is none (or not yet a whole one)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        end = data.get("end")
        return Decision(int(data["run"]), {str(k): str(v) for k, v in data["env"].items()},
                        None if end is None else int(end), bool(data.get("over", False)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def rank_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a forked rank sets before anything reads its environment: the restart file's
    variables when it is for a later run than the one its launcher (and forkserver) started
    with; else nothing (a first run, or a launcher not offered restarts in place)."""
    path = environ.get(RESTART_FILE_VAR)
    if not path:
        return {}
    found = read(Path(path))
    if found is None or found.end is not None or found.run <= int(environ.get(RUN_VAR, "0") or 0):
        return {}
    return found.env


def wait_for(path: Path, after: int, parent: int,
             ppid: Callable[[], int] = os.getppid) -> Decision | None:
    """Block until the supervisor asks for run `after + 1` or later, or to end; None once this
    process's parent (`parent`, the supervisor or its keeper) is gone: nobody will ask then."""
    while True:
        found = read(path)
        if found is not None and (found.end is not None or found.run > after):
            return found
        if ppid() != parent:
            return None
        time.sleep(POLL_S)


def install(path: Path) -> None:
    """Patch torch's local elastic agent in this launcher: a failed worker group waits for the
    supervisor (above) instead of ending the launcher. Call before torchrun's `main`; the
    caller raises torchrun's `--max-restarts` so the agent reaches `_restart_workers`."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    monitor = LocalElasticAgent._monitor_workers
    restart = LocalElasticAgent._restart_workers
    parent = os.getppid()

    def monitored(self: Any, group: Any) -> Any:
        result = monitor(self, group)
        if result.is_failed():
            self.__dict__["_gpufleet_failed"] = result
        return result

    def restarted(self: Any, group: Any) -> None:
        failed = self.__dict__.pop("_gpufleet_failed", None)
        if failed is None:  # new nodes waiting (not a failure): torch's own restart
            restart(self, group)
            return
        self._stop_workers(group)
        group.state = WorkerState.STOPPED
        run = int(os.environ.get(RUN_VAR, "0") or 0)
        # what torchrun prints as it ends, so the failure reads the same from the logs
        print(f"{ChildFailedError(group.spec.get_entrypoint_name(), failed.failures)}",
              file=sys.stderr)
        print(parked_line(1, run), file=sys.stderr, flush=True)
        found = wait_for(path, run, parent)
        if found is None:
            print("gpufleet: the supervisor is gone; the launcher ends", file=sys.stderr,
                  flush=True)
            raise SystemExit(1)
        if found.end is not None:  # no restart: end as torchrun would have, summary printed
            raise SystemExit(found.end)
        os.environ.update(found.env)
        print(f"gpufleet: run {found.run}: the workers restart inside the running launcher",
              file=sys.stderr, flush=True)
        self._initialize_workers(group)

    setattr(LocalElasticAgent, "_monitor_workers", monitored)  # noqa: B010 - a patch
    setattr(LocalElasticAgent, "_restart_workers", restarted)  # noqa: B010
