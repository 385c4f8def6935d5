"""What a multi-node run's plan says about the workdir that travels, and what a node's entry
becomes once it runs in a shipped copy. Pure: a spec in, plain JSON-able data out.

The plan's `workdir` section (`section`) is what the driver needs to decide and ship: the folder
that travels, the cap, the setup command and whether to keep the copy. The driver probes the
nodes (backends/shipping.py) and, for each node that does not see the folder, ships the
selection and rewrites that node's entry (`on_node`): its working folder and every argument or
variable naming the submitter's folder now name the node's copy, and the node is told to send
back what torchrun writes under the job folder it does not see (`files_back`).
"""

from __future__ import annotations

import os
import posixpath
from pathlib import PurePosixPath
from typing import Any

from gpufleet.errors import SpecError
from gpufleet.launch.workdir import DEFAULT_MAX_UPLOAD


def shipped_root(workdir: str | None, script: str) -> str:
    """The folder that travels: the job's workdir (where the script runs; `run` fills in the
    submitting shell's folder), else the script's own folder. A script outside it would not
    be on the node: refused with the fix."""
    if workdir is None:
        return posixpath.dirname(posixpath.abspath(script)) or "/"
    root = posixpath.abspath(workdir)
    path = posixpath.normpath(posixpath.join(root, script))
    if path != root and not path.startswith(root.rstrip("/") + "/"):
        raise SpecError([("script", f"{script} is outside the workdir {root}, which is what "
                          "travels to nodes that do not share this machine's files; run from a "
                          "folder that holds the script, or set workdir: to one")])
    return root


def section(workdir: str | None, script: str, setup: str | None, max_upload: int | None,
            keep: bool) -> dict[str, Any]:
    """The plan's `workdir` section. A script outside the workdir is a `problem` only if the
    workdir must travel (on nodes that share the files it runs as it always did)."""
    try:
        root, problem = shipped_root(workdir, script), ""
    except SpecError as exc:
        root, problem = posixpath.abspath(workdir or "."), str(exc)
    return {"root": root, "setup": setup or "", "max_upload": max_upload or DEFAULT_MAX_UPLOAD,
            "keep": keep, "problem": problem}


def _mapped(value: str, root: str, placed: str) -> str:
    """`value` with a leading `root` (the whole of it, or a path under it, also after `=` as
    in `--data=/root/x`) replaced by `placed`."""
    head, eq, tail = value.rpartition("=") if "=" in value else ("", "", value)
    if tail == root or tail.startswith(root.rstrip("/") + "/"):
        tail = placed + tail[len(root):]
    return f"{head}{eq}{tail}"


def on_node(entry: dict[str, Any], root: str, placed: str, job_dir: str) -> dict[str, Any]:
    """A node's plan entry for a run in the shipped copy `placed` of `root`: its folder, and
    the arguments and variables that named `root`. What names the job folder `job_dir` is left
    alone: the node writes there on its own disk, and `files_back` tells its agent to send
    what torchrun wrote under it back to the driver (backends/files_back.py)."""
    assert PurePosixPath(root).is_absolute() and PurePosixPath(placed).is_absolute()
    root = os.path.normpath(root)
    return {**entry,
            "cwd": _mapped(os.path.normpath(entry["cwd"]), root, placed),
            "argv": [_mapped(a, root, placed) for a in entry["argv"]],
            "env": {k: _mapped(v, root, placed) for k, v in entry["env"].items()},
            "files_back": job_dir}
