"""A job's containers left on a node, found by their label and removed.

The keeper removes its run's container by name once the runtime's client ended. What it cannot
cover is a keeper that was itself killed at once (a Slurm step SIGKILLed by `scancel` or a
stop: slurmstepd ends every process of the step, the keeper's clean-up with them). Every
container gpufleet starts carries `gpufleet.job=JOB` (launch/container.py), so a clean-up on
the node after the run (Slurm's clean-up step, backends/slurm_clean.py) finds and removes the
job's containers, whichever run left them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping

from gpufleet.backends import runtime
from gpufleet.backends.runtime import Run, run_argv
from gpufleet.launch.container import NodeSide, cleanup_argv, leftovers_argv

LIST_TIMEOUT_S = 30.0


def remove_job_containers(job: str, run: Run = run_argv,
                          environ: Mapping[str, str] | None = None,
                          which: Callable[[str], str | None] = shutil.which) -> int | None:
    """How many of `job`'s containers were removed on this node; None without a runtime."""
    env = dict(os.environ) if environ is None else environ
    facts = runtime.runtime_facts(run, env, which)
    if facts.path is None or facts.flavor is None:
        return None
    side = NodeSide(runtime=facts.path, flavor=facts.flavor)
    listed = run(leftovers_argv(side, job), LIST_TIMEOUT_S, None)
    if listed.returncode != 0:
        return None
    removed = 0
    for cid in listed.stdout.split():
        if run(cleanup_argv(side, cid), LIST_TIMEOUT_S, None).returncode == 0:
            removed += 1
    return removed
