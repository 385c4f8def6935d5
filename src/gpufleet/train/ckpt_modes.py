"""Who may read a checkpoint: its owner only, unless the user shares it on purpose.

A checkpoint holds the model's weights and whatever `extra` state a script saves, and the
durable copy usually lives outside the private `$GPUFLEET_HOME` (a shared volume, NFS). With the
usual umask 022 every folder would be 0755 and every file 0644: readable by every user of the
machine. So the checkpoint folders the Checkpointer makes (locally, in a durable folder, and a
download from a URL) are 0700 and their files 0600. `Checkpointer(shared=True)` or
`GPUFLEET_CHECKPOINT_SHARED=1` (`gpufleet run -e GPUFLEET_CHECKPOINT_SHARED=1`) leaves the
modes to the umask, as before. At an fsspec URL the store decides who reads (bucket policies,
ACLs); nothing is set there.

Folders that already exist (a `--checkpoint-to` root the user made) keep their modes; only the
folders created here are restricted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

SHARED_ENV = "GPUFLEET_CHECKPOINT_SHARED"
DIR_MODE, FILE_MODE = 0o700, 0o600
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def shared_from(shared: bool | None, env: Mapping[str, str]) -> bool:
    """The argument when given, else `$GPUFLEET_CHECKPOINT_SHARED`; ValueError naming the
    variable for a value that is neither yes nor no."""
    if shared is not None:
        return shared
    raw = env.get(SHARED_ENV, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{SHARED_ENV}: got {env.get(SHARED_ENV)!r}; use 1 (shared: the umask "
                     "decides) or 0 (owner only, the default)")


def make_dir(path: Path, private: bool) -> None:
    """`mkdir -p`, where every folder it creates is owner-only when `private`."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE if private else 0o777)
        except FileExistsError:  # another rank or node made it first
            continue
        if private:
            folder.chmod(DIR_MODE)  # mkdir's mode is cut by the umask; say exactly what we mean


def restrict(folder: Path, private: bool) -> None:
    """A checkpoint folder we made, and the files in it, owner-only (no-op when shared)."""
    if not private:
        return
    try:
        folder.chmod(DIR_MODE)
        entries = list(folder.iterdir())
    except FileNotFoundError:
        # storage shared between nodes (NFS, or nodes on one host): rank 0 renamed the partial
        # folder already, after restricting every file in it itself
        return
    for p in entries:
        with contextlib.suppress(FileNotFoundError):
            if p.is_file() and not p.is_symlink():
                p.chmod(FILE_MODE)


def copy_file(src: Path, dest: Path, private: bool) -> None:
    """Copy the bytes of `src` to `dest`, created 0600 when `private` (`shutil.copyfile` would
    create it by the umask, readable by all until a chmod)."""
    if not private:
        shutil.copyfile(src, dest)
        return
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    os.chmod(dest, FILE_MODE)  # an existing file keeps its old mode through O_CREAT
