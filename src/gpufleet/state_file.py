"""Whether the state file ($GPUFLEET_HOME/state.db) can be opened, and its damage as one line.

The store is SQLite in WAL mode: `state.db` with `state.db-wal` and `state.db-shm` beside it
while it is open. What this module refuses, before anything opens the file:

- a folder (or anything but a file) where the state file should be;
- a file too short to be SQLite (under its 100-byte header: a truncated file); a longer file
  that is not SQLite (garbage) is SQLite's own error, SQLITE_NOTADB, below;
- `state.db` missing (or empty) while its `-wal` or `-shm` is there: the file was removed or
  truncated, most likely under a running job. Opening it would create a new, empty store and
  every record (reservations included) would be gone without a word.

Any sqlite3 error that means the file cannot be used (not a database, corrupt, read-only,
cannot be opened, I/O, busy) becomes the same kind of line through `db_error`, wherever it is
raised: the store, the stdlib fast paths (`snapshot`), the dashboard. Stdlib only, so the fast
paths can use it without SQLAlchemy.

The file is only ever stat-ed here, never opened: closing any descriptor of a file drops every
POSIX lock the process holds on it, SQLite's included, and another process could then delete
the WAL under this process's own open store.
"""

from __future__ import annotations

import enum
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import StateError, excerpt

HEADER_BYTES = 100  # SQLite's database header; a valid file is never shorter
SIDE_FILES = ("-wal", "-shm")


class Kind(enum.Enum):
    MISSING = "missing"
    FILE = "file"
    FOLDER = "folder"
    OTHER = "other"  # a link, a socket, a device


@dataclass(frozen=True)
class Facts:
    """What is on disk at the state file's path."""

    kind: Kind
    size: int = 0  # bytes
    side_files: tuple[str, ...] = ()  # which of -wal, -shm exist beside it


def facts(path: Path) -> Facts:
    """One lstat of the file and of its side files (never an open: see above)."""
    sides = tuple(s for s in SIDE_FILES if path.with_name(path.name + s).exists())
    try:
        st = path.lstat()
    except FileNotFoundError:
        return Facts(Kind.MISSING, side_files=sides)
    if stat.S_ISDIR(st.st_mode):
        return Facts(Kind.FOLDER, side_files=sides)
    if not stat.S_ISREG(st.st_mode):
        return Facts(Kind.OTHER, side_files=sides)
    return Facts(Kind.FILE, st.st_size, sides)


def move_aside(path: Path) -> str:
    return (f"move it aside (mv {path} {path}.damaged, with any {path.name}-wal and -shm) to "
            f"start an empty store; `gpufleet doctor` explains")


def open_problem(path: Path, f: Facts) -> str | None:
    """Why the store must not open `path` (one line: what is wrong and what to do), or None:
    a missing or empty file with no side files (a new store), or a file long enough for
    SQLite (whether it is SQLite is SQLite's to say, through `db_error`)."""
    if f.kind is Kind.MISSING or (f.kind is Kind.FILE and f.size == 0):
        if not f.side_files:
            return None  # a new store
        sides = " and ".join(path.name + s for s in f.side_files)
        gone = "missing" if f.kind is Kind.MISSING else "empty"
        are = "is" if len(f.side_files) == 1 else "are"
        return (f"the state file {path} is {gone} but {sides} {are} still there: it was removed or "
                f"truncated, perhaps under a running job, and opening it would start an empty "
                f"store; restore it, or move {sides} aside to start an empty one; "
                f"`gpufleet doctor` explains")
    if f.kind is not Kind.FILE:
        return f"the state file {path} is a {f.kind.value}, not a file; {move_aside(path)}"
    if f.size < HEADER_BYTES:
        return (f"the state file {path} is not an SQLite database ({f.size} bytes: truncated "
                f"or overwritten); {move_aside(path)}")
    return None


def check_openable(path: Path) -> None:
    """Raise StateError when `open_problem` finds one."""
    problem = open_problem(path, facts(path))
    if problem is not None:
        raise StateError(problem)


# sqlite3's error names (Python 3.11+) that mean the file, not the query, is at fault.
_DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
_UNWRITABLE = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")
_UNAVAILABLE = ("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_BUSY", "SQLITE_LOCKED")


def db_problem(path: Path, errorname: str, text: str) -> str | None:
    """The one line for an sqlite3 error on the state file, or None when the error is about a
    query (a constraint, SQL), which is a bug to show as one."""
    why = excerpt(text)
    if errorname.startswith(_DAMAGED):
        return f"the state file {path} cannot be read ({why}); {move_aside(path)}"
    if errorname.startswith(_UNWRITABLE):
        return (f"the state file {path} cannot be opened for writing ({why}); make it and its "
                f"folder writable by you (or clear an immutable flag: chattr -i), or "
                f"{move_aside(path)}")
    if errorname.startswith(_UNAVAILABLE):
        return (f"the state file {path} cannot be used now ({why}): free disk space, or wait "
                f"for the command holding it and try again; `gpufleet doctor` explains")
    return None


def db_error(path: Path, exc: BaseException) -> StateError | None:
    """`exc` (an sqlite3 error, or an SQLAlchemy one wrapping it, or anything raised from one)
    as a StateError, or None when it is not about the state file."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, sqlite3.Error):
            problem = db_problem(path, getattr(cur, "sqlite_errorname", "") or "", str(cur))
            return StateError(problem) if problem else None
        orig = getattr(cur, "orig", None)
        cur = orig if isinstance(orig, BaseException) else (cur.__cause__ or cur.__context__)
    return None
