"""The state folder ($GPUFLEET_HOME, else ~/.gpufleet): which folder may be used, and creating it.

It holds the state file, job logs, checkpoints and tokens, all meant for its owner alone. So a
folder gpufleet creates is made owner-only (0700), and a folder that already exists is used as
it is, never chmod-ed: pointing GPUFLEET_HOME at a shared folder (a 1777 /tmp, a team folder)
must not lock everyone else out of it. Such a folder is refused instead, as is a folder of
another user. A symbolic link (~/.gpufleet on a scratch disk) is judged by the folder it points
to, and must be the user's own link: someone else's could be pointed elsewhere under us.

`home_problem` is the decision, on facts `folder_facts` reads with one lstat; stdlib only, so
the fast read paths (`snapshot`) can check the folder as cheaply as the store does.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import StateError

OWNER_ONLY = 0o700
SUBFOLDERS = ("jobs", "clusters")


@dataclass(frozen=True)
class FolderFacts:
    """What `lstat` says about a path (the path itself, not what a link points to)."""

    exists: bool
    is_symlink: bool = False
    is_dir: bool = False
    mode: int = 0  # permission bits, e.g. 0o1777
    owner_uid: int = 0


def home_path() -> Path:
    """Where the state folder is, found without creating or checking anything."""
    return Path(os.environ.get("GPUFLEET_HOME") or Path.home() / ".gpufleet").expanduser()


def folder_facts(path: Path, follow: bool = False) -> FolderFacts:
    try:
        st = path.stat() if follow else path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return FolderFacts(exists=False)
    except OSError:
        if not follow:
            raise
        return FolderFacts(exists=False)  # a loop of links: nothing to use
    return FolderFacts(True, stat.S_ISLNK(st.st_mode), stat.S_ISDIR(st.st_mode),
                       stat.S_IMODE(st.st_mode), st.st_uid)


def home_problem(home: Path, facts: FolderFacts, my_uid: int,
                 target: FolderFacts | None = None, shown: str | None = None) -> str | None:
    """Why `home` cannot be the state folder (one line: why, and what to do), or None when it
    can: missing (it will be created owner-only) or an existing folder of `my_uid`'s that no
    one else can write to (group/other write bits clear), whatever its other bits. For a
    symbolic link, `target` is what it points to (`stat`, following it)."""
    if not facts.exists:
        return None
    name = shown or str(home)
    fix = f"set GPUFLEET_HOME to a new path (gpufleet creates it owner-only), e.g. {home}/gpufleet"
    if facts.is_symlink:
        if facts.owner_uid != my_uid:
            return (f"GPUFLEET_HOME: {home} is a symbolic link of another user (uid "
                    f"{facts.owner_uid}), who could point it elsewhere; {fix}")
        if target is None or not target.exists:
            return f"GPUFLEET_HOME: {home} is a symbolic link to nothing; {fix}"
        return home_problem(home, target, my_uid, shown=f"{home} (a link to {home.resolve()})")
    if not facts.is_dir:
        return f"GPUFLEET_HOME: {name} is not a folder; {fix}"
    if facts.mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"GPUFLEET_HOME: {name} can be written by other users (mode "
                f"{facts.mode:04o}) and gpufleet keeps its state owner-only; {fix}")
    if facts.owner_uid != my_uid:
        return (f"GPUFLEET_HOME: {name} belongs to another user (uid {facts.owner_uid}); "
                f"{fix}")
    return None


def checked_home() -> Path:
    """The state folder, refused (StateError) when it may not be used; nothing is created."""
    home = home_path()
    facts = folder_facts(home)
    target = folder_facts(home, follow=True) if facts.is_symlink else None
    problem = home_problem(home, facts, os.getuid(), target)
    if problem is not None:
        raise StateError(problem)
    return home


def ensure_home() -> Path:
    """The state folder and its subfolders, creating (owner-only) those that are missing."""
    home = checked_home()
    try:
        for folder in (home, *(home / name for name in SUBFOLDERS)):
            _make_private(folder)
    except OSError as exc:
        raise StateError(f"GPUFLEET_HOME: cannot use {home} as a private state folder: "
                         f"{exc.strerror or exc}") from None
    return home


def _make_private(folder: Path) -> None:
    """Create `folder` 0700 (whatever the umask) if it is missing; leave an existing one be."""
    folder.parent.mkdir(parents=True, exist_ok=True)  # parents as `mkdir -p` makes them
    try:
        folder.mkdir(mode=OWNER_ONLY)
    except FileExistsError:  # there already (or made a moment ago by another command)
        return
    folder.chmod(OWNER_ONLY)  # ours: the umask may have taken bits off, never added any
