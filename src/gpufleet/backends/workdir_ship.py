"""The driver's side of the workdir that travels, the same for every engine: pack what the
plan's `workdir` section names, and the lines the job's log shows about it.

A driver (ray_run, slurm_run, ssh_run) probes its nodes (shipping.probe, with the probe file
in the job folder), then packs only when some node does not see the folder or a setup must run
(`needed`); the engine moves the bytes its own way (Ray's object store, sbcast, the ssh
connection) and the node places them with node_workdir.place. A refusal (too large, a script
outside the folder) or a failed setup ends the run with one `WorkdirError:` / `SetupError:`
line, which the supervisor reads as the run's reason.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.backends.shipping import Sharing
from gpufleet.errors import GpufleetError
from gpufleet.launch.workdir import Selection, human, select, write_tar


@dataclass(frozen=True)
class Packed:
    sel: Selection
    tar: bytes  # the tar.gz of the selection


def needed(section: dict[str, Any], sharing: Sharing) -> bool:
    """Whether the workdir must be read at all: some node does not see it, or setup runs."""
    return sharing.ships or bool(section.get("setup"))


def pack(section: dict[str, Any], ships: bool) -> Packed:
    """The selection of the section's folder and, if it `ships`, its tar. GpufleetError (a
    script outside the folder, UploadTooLarge) when it cannot travel; nothing shipped (setup
    only, on nodes that see the folder), no cap applies."""
    if ships and section.get("problem"):
        raise GpufleetError(section["problem"])
    sel = select(Path(section["root"]), int(section["max_upload"]) if ships else 1 << 62)
    buf = io.BytesIO()
    if ships:
        write_tar(sel, buf)
    return Packed(sel, buf.getvalue())


def shared_line(root: str) -> str:
    return f"workdir: every node sees {root}; nothing shipped"


def shipped_line(packed: Packed, names: list[str], reused: tuple[str, ...] = ()) -> str:
    sel = packed.sel
    line = (f"workdir {sel.digest[:12]}: {len(sel.entries)} file(s), {human(sel.total_bytes)} "
            f"({len(packed.tar)} bytes packed)")
    sent = f" shipped to {', '.join(names)}" if names else " shipped to no node"
    return line + sent + (f"; already on {', '.join(reused)} (not sent)" if reused else "")


def error_line(exc: BaseException) -> str:
    """The run's reason as one `XError: text` line."""
    from gpufleet.backends.node_workdir import SetupFailed

    cause = getattr(exc, "cause", None) or exc  # a Ray task error carries the node's exception
    if isinstance(cause, SetupFailed):
        return f"SetupError: {cause}"
    text = " ".join(str(cause).split()) or type(cause).__name__
    return f"WorkdirError: {text}"
