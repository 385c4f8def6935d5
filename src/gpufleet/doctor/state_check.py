"""The doctor's check of the state file ($GPUFLEET_HOME/state.db): is it there, is it SQLite,
and does SQLite's own `PRAGMA quick_check` find it intact.

Every other command refuses a damaged state file with one line that points here; this is where
the damage is named in full (what SQLite found, the side files) with the fix. `state_facts` is
the edge (a read-only open, the pragma); `state_file_check` the pure verdict.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpufleet import state_file
from gpufleet.doctor.model import Check, StateFacts
from gpufleet.errors import excerpt

QUICK_CHECK_ROWS = 5  # SQLite lists up to 100 problems; the first few say enough
# A busy store is not a damaged one: wait up to this long for a writer before judging.
BUSY_TIMEOUT_S = 5.0


def state_facts(path: Path) -> StateFacts:
    f = state_file.facts(path)
    exists = f.kind is not state_file.Kind.MISSING
    problem = state_file.open_problem(path, f)
    if problem is not None or f.kind is not state_file.Kind.FILE or f.size == 0:
        return StateFacts(str(path), exists, problem)
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            rows = db.execute(f"PRAGMA quick_check({QUICK_CHECK_ROWS})").fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        return StateFacts(str(path), exists, None, error=str(exc))
    return StateFacts(str(path), exists, None, tuple(str(r[0]) for r in rows))


def state_file_check(f: StateFacts) -> Check:
    data = {"path": f.path, "quick_check": list(f.quick_check)}
    if f.open_problem is not None:
        return Check("state-file", "fail", f.open_problem.split(";")[0], _fix(f), data)
    if not f.exists or (not f.quick_check and f.error is None):
        return Check("state-file", "pass", f"{f.path}: none yet (made by the first command)",
                     data=data)
    if f.error is not None:
        return Check("state-file", "fail", f"{f.path}: SQLite cannot read it: {excerpt(f.error)}",
                     _fix(f), data)
    if f.quick_check == ("ok",):
        return Check("state-file", "pass", f"{f.path}: intact (PRAGMA quick_check)", data=data)
    found = "; ".join(excerpt(r) for r in f.quick_check)
    return Check("state-file", "fail", f"{f.path}: damaged: {found}", _fix(f), data)


def _fix(f: StateFacts) -> str:
    p = f.path
    return (f"no command can use it as it is. Stop any job still running; then keep a copy "
            f"(mv {p} {p}.damaged, and {p}-wal, {p}-shm when present): the next command starts "
            f"an empty store, which forgets every cluster, reservation and job. SQLite's .recover "
            f"(sqlite3 {p}.damaged .recover) may save some rows")
