"""A job's script looked for on this machine's disk: the one check of a job that reads files.

`JobSpec.parse` validates data only (so it runs anywhere, in tests without fixtures, and
means the same on a client and a server); the edges that take a job for this machine (the
CLI's `run`, the server's POST /jobs) look at the disk here and hand what they found to
`JobSpec.parse`, which reports it with every other problem of the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.spec import JobSpec


def script_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """('script', why) when the script is not a file, relative to the job's `workdir` (the
    current folder when none) as the worker will open it; [] when it is, or when there is no
    script to look for (the spec's own rule names that)."""
    script = data.get("script")
    if not isinstance(script, str) or not script.strip():
        return []
    path = Path(str(data.get("workdir") or ".")) / script
    if path.is_file():
        return []
    if path.is_dir():
        return [("script", f"{script} is a directory, not a script")]
    return [("script", f"no such file: {script}")]


def parse_job_here(data: Mapping[str, Any]) -> JobSpec:
    """The validated job, its script checked on this machine's disk, all problems in one
    SpecError."""
    return JobSpec.parse(dict(data), found=script_problems(data))
