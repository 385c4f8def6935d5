"""Noticing, while a job runs, that its state file was removed, replaced or truncated.

The supervisor keeps the store open for the whole job. If `state.db` is deleted or replaced
under it, SQLite goes on writing to the old, unlinked file without an error, and the next
command would see no record of the job, nor of the devices it holds: another job could be given
the same devices. So the supervisor compares the file's identity with the one it opened every
`EVERY_S` seconds, and when it changed the job ends (see `Supervisor._watch`), with one line in
its logs; the store is not written again, and never re-created empty.

`lost` is the decision on two `Identity`s; `identity` the one stat per check. The file is never
opened here: closing a descriptor of it would drop the POSIX locks SQLite holds on it for this
process, and another command's SQLite could then delete the WAL this store still writes to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.state_file import HEADER_BYTES

EVERY_S = 1.0  # how often the file is looked at: one stat, well under a millisecond


class StoreLost(GpufleetError):
    """The state file this supervisor opened is gone: the job cannot be recorded."""


@dataclass(frozen=True)
class Identity:
    """Which file is at the path (device, inode), and its size."""

    dev: int
    ino: int
    size: int  # bytes


def identity(path: Path) -> Identity | None:
    """The file at `path` now, or None when there is none (OSError when it cannot be told)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return Identity(st.st_dev, st.st_ino, st.st_size)


def lost(path: Path, opened: Identity, now: Identity | None) -> str | None:
    """Why the file at `path` is no longer the store the job was recorded in, or None."""
    if now is None:
        return f"the state file {path} was removed"
    if (now.dev, now.ino) != (opened.dev, opened.ino):
        return f"the state file {path} was replaced by another file"
    if now.size < HEADER_BYTES:
        return f"the state file {path} was truncated ({now.size} bytes)"
    return None


class StoreWatch:
    """Checks one state file at most every `EVERY_S` seconds of the monotonic clock."""

    def __init__(self, path: Path | None):
        self.path = path
        self.opened = identity(path) if path is not None else None
        self.next_at = 0.0

    def check(self, now_monotonic: float) -> None:
        """Raise StoreLost when the file changed; a store without a file is never checked."""
        if self.path is None or self.opened is None or now_monotonic < self.next_at:
            return
        self.next_at = now_monotonic + EVERY_S
        try:
            now = identity(self.path)
        except OSError:  # the folder cannot be looked into this moment: look again later
            return
        why = lost(self.path, self.opened, now)
        if why is not None:
            raise StoreLost(f"{why} while the job ran: its record and device reservation are gone, "
                            "so the job is ended (another job could be given its devices); "
                            "nothing was written to a new state file. Run `gpufleet doctor`")
