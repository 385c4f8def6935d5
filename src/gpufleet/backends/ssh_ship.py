"""The workdir a run on an SSH pool ships to its hosts: its digest, and a tar of it.

Stand-in until `launch/workdir.py` (the engine-neutral selection: ignore files, size cap)
lands on this branch: every file below the folder except `.git/`, `__pycache__/` and `.venv/`,
in a deterministic tar (sorted, mtime 0, owner 0), so the same content has the same digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

SKIP = {".git", "__pycache__", ".venv"}


def files(root: Path) -> list[Path]:
    """The workdir's files, relative to it, sorted."""
    out: list[Path] = []
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP)
        base = Path(here)
        out.extend((base / n).relative_to(root) for n in names
                   if (base / n).is_file() and not (base / n).is_symlink())
    return sorted(out)


def digest(root: Path) -> str:
    """sha256 over the sorted paths, modes and contents."""
    h = hashlib.sha256()
    for rel in files(root):
        path = root / rel
        h.update(rel.as_posix().encode() + b"\0")
        h.update(oct(path.stat().st_mode & 0o777).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def tar_bytes(root: Path) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for rel in files(root):
            info = tar.gettarinfo(str(root / rel), arcname=rel.as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with (root / rel).open("rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()
