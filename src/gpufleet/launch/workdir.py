"""The workdir that travels: which files of a job's folder go to nodes that do not share it,
their content hash, and the tar that carries them (issue 29).

    select(root)          -> Selection    the files git would keep, plus .gpufleetignore, capped
    write_tar(sel, out)   -> bytes        a deterministic tar.gz of exactly the selection
    unpack(stream, dest)                  the node side: refuses anything that would land outside

The digest names the content, not the moment: the same files with the same modes give the same
digest on any machine on any day, so a node that already holds `cache/DIGEST` is sent nothing.
Only file contents, paths, the executable bit and link targets count; mtimes, owners and umask
do not (they differ between checkouts of the same commit).

Symlinks are kept as links when they point inside the root (a relative `data -> shards/v2`
works on the node too); a link pointing out of the root is left out, since what it names is
not on the node either and following it could ship a home directory. Directory links are never
followed. Empty folders are not shipped (as git does not track them).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import posixpath
import re
import secrets
import shutil
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gpufleet.errors import GpufleetError

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

DEFAULT_MAX_UPLOAD = 100 * 2**20  # bytes; the sum of the selected files' sizes
MIN_MAX_UPLOAD = 2**20  # a cap below 1 MiB is a typo (a unit left out), not a wish
ALWAYS_SKIPPED = (".git", "__pycache__", ".venv")  # folder names skipped at any depth
IGNORE_FILE = ".gpufleetignore"
LARGEST_NAMED = 5
_LINK_MODE = stat.S_IFLNK | 0o777
_CHUNK = 1 << 20


class UploadTooLarge(GpufleetError, ValueError):
    """The selection is above the cap; the message names what to leave out and how."""


class UnsafeArchive(ValueError):
    """A tar that would write outside its destination, or holds what a workdir never holds."""


@dataclass(frozen=True)
class Entry:
    """One shipped file or link. `path` is posix and relative to the root; `size` is bytes (a
    link's is its target's length); `mode` is normalised: 0o100644, 0o100755 or a link's."""

    path: str
    size: int
    mode: int

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)


@dataclass(frozen=True)
class Selection:
    root: Path
    entries: tuple[Entry, ...]  # sorted by path
    digest: str  # sha256 hex over paths, modes and contents
    total_bytes: int


def parse_size(text: str) -> int:
    """'100MB', '1GB', '512k', '2GiB' or a plain byte count, as bytes. Units are binary
    (1 MB = 2**20 bytes, so the default cap reads as `100MB`). ValueError if not a size."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m or (m.group(3) and not m.group(2) and m.group(3) == "ib"):
        raise ValueError(f"'{text}' is not a size (examples: 100MB, 1GB, 500KiB)")
    mult = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2)]
    return int(float(m.group(1)) * mult)


def human(n_bytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes} B"


# -- choosing the files ------------------------------------------------------------------------
class _Rules:
    """The ignore files in force for one folder: (base, spec) from the root down, the root's
    .gpufleetignore last so that it has the final word (git's order: deeper and later wins)."""

    def __init__(self, layers: tuple[tuple[str, GitIgnoreSpec], ...], last: tuple[str, GitIgnoreSpec] | None):
        self.layers = layers
        self.last = last

    def ignored(self, rel: str, is_dir: bool) -> bool:
        verdict = False
        for base, spec in (*self.layers, *((self.last,) if self.last else ())):
            if base and not rel.startswith(base + "/"):
                continue
            sub = rel[len(base) + 1:] if base else rel
            result = spec.check_file(sub + "/" if is_dir else sub)
            if result.include is not None:
                verdict = bool(result.include)
        return verdict


def _spec(path: Path) -> GitIgnoreSpec | None:
    import pathspec

    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _norm_mode(st_mode: int) -> int:
    return stat.S_IFREG | (0o755 if st_mode & stat.S_IXUSR else 0o644)


def _link_inside(rel: str, target: str) -> bool:
    if os.path.isabs(target):
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return joined != ".." and not joined.startswith("../")


def _walk(root: Path) -> list[Entry]:
    last_spec = _spec(root / IGNORE_FILE)
    last = ("", last_spec) if last_spec is not None else None
    found: list[Entry] = []

    def visit(folder: Path, rel_dir: str, layers: tuple[tuple[str, GitIgnoreSpec], ...]) -> None:
        here = _spec(folder / ".gitignore")
        if here is not None:
            layers = (*layers, (rel_dir, here))
        rules = _Rules(layers, last)
        with os.scandir(folder) as it:
            items = sorted(it, key=lambda e: e.name)
        for item in items:
            rel = f"{rel_dir}/{item.name}" if rel_dir else item.name
            if item.is_symlink():
                if rules.ignored(rel, False):
                    continue
                target = os.readlink(item.path)
                if _link_inside(rel, target):
                    found.append(Entry(rel, len(target.encode()), _LINK_MODE))
            elif item.is_dir(follow_symlinks=False):
                if item.name in ALWAYS_SKIPPED or rules.ignored(rel, True):
                    continue
                visit(Path(item.path), rel, layers)
            elif item.is_file(follow_symlinks=False) and not rules.ignored(rel, False):
                st = item.stat(follow_symlinks=False)
                found.append(Entry(rel, st.st_size, _norm_mode(st.st_mode)))
            # sockets, fifos and devices are never part of a workdir

    visit(root, "", ())
    return sorted(found, key=lambda e: e.path)


def _too_large(root: Path, entries: list[Entry], total: int, cap: int) -> UploadTooLarge:
    largest = sorted(entries, key=lambda e: (-e.size, e.path))[:LARGEST_NAMED]
    named = ", ".join(f"{e.path} ({human(e.size)})" for e in largest)
    return UploadTooLarge(
        f"the workdir {root} holds {human(total)} to ship, above the cap of {human(cap)}; "
        f"largest: {named}. Fix: list what the job does not need in {root / IGNORE_FILE} "
        f"(.gitignore syntax), or raise the cap with --max-upload (max_upload: in the job file)")


def select(root: Path, max_bytes: int = DEFAULT_MAX_UPLOAD) -> Selection:
    """The files of `root` that travel, their total size and digest. Raises UploadTooLarge
    before reading any content when the sizes add up above `max_bytes`."""
    root = root.resolve()
    entries = _walk(root)
    total = sum(e.size for e in entries)
    if total > max_bytes:
        raise _too_large(root, entries, total, max_bytes)
    h = hashlib.sha256()
    for e in entries:
        h.update(f"{e.path}\0{e.mode:o}\0{e.size}\0".encode())
        if e.is_link:
            h.update(os.readlink(root / e.path).encode())
        else:
            with open(root / e.path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
        h.update(b"\0")
    return Selection(root=root, entries=tuple(entries), digest=h.hexdigest(), total_bytes=total)


# -- the archive -------------------------------------------------------------------------------
class _Counting:
    """A write-only stream that counts what passes through to `out`."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.count = 0

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def write_tar(sel: Selection, out: BinaryIO) -> int:
    """The selection as a tar.gz on `out`, byte-identical for the same selection (mtime 0,
    owner 0, sorted, no name in the gzip header). Returns the bytes written."""
    counting = _Counting(out)
    with (gzip.GzipFile(filename="", mode="wb", fileobj=counting, mtime=0) as gz,  # type: ignore[arg-type]
          tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar):
        for e in sel.entries:
            info = tarfile.TarInfo(e.path)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = stat.S_IMODE(e.mode)
            if e.is_link:
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(sel.root / e.path)
                tar.addfile(info)
                continue
            info.size = e.size
            with open(sel.root / e.path, "rb") as f:
                if os.fstat(f.fileno()).st_size != e.size:
                    raise OSError(f"{e.path} changed while the workdir was being packed")
                tar.addfile(info, f)
    return counting.count


def _check_member(m: tarfile.TarInfo) -> str:
    name = m.name
    parts = name.split("/")
    if os.path.isabs(name) or name.startswith("\\") or ".." in parts or not name.strip("/"):
        raise UnsafeArchive(f"refused: the archive names {name!r}, outside its folder")
    if not (m.isfile() or m.isdir() or m.issym()):
        raise UnsafeArchive(f"refused: {name!r} is neither a file, a folder nor a link")
    if m.issym() and not _link_inside(posixpath.normpath(name), m.linkname):
        raise UnsafeArchive(f"refused: the link {name!r} points out of its folder ({m.linkname!r})")
    return posixpath.normpath(name)


def _extract(tar: tarfile.TarFile, into: Path) -> None:
    real_into = os.path.realpath(into)
    for m in tar:
        rel = _check_member(m)
        target = into / rel
        parent = os.path.dirname(rel)
        if parent:
            os.makedirs(into / parent, exist_ok=True)
        # A parent that is a link (made by an earlier member) would let a lexically clean name
        # land elsewhere; members are only ever written through real folders.
        if os.path.realpath(into / parent) != os.path.join(real_into, parent).rstrip("/"):
            raise UnsafeArchive(f"refused: {m.name!r} would be written through a link")
        if m.isdir():
            os.makedirs(target, exist_ok=True)
        elif m.issym():
            os.symlink(m.linkname, target)
        else:
            src = tar.extractfile(m)
            assert src is not None
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o755 if m.mode & 0o100 else 0o644)
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(src, f, _CHUNK)


def unpack(src: BinaryIO, dest: Path) -> None:
    """Unpack a tar.gz from `src` (read as a stream; a pipe will do) into `dest`, atomically:
    into a temporary sibling, then renamed. An existing `dest` is kept as it is (same digest,
    same content: another job got there first). UnsafeArchive for anything that would write
    outside `dest`; nothing is left behind then."""
    if dest.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.part-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        with tarfile.open(fileobj=src, mode="r|gz") as tar:
            _extract(tar, tmp)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.exists():
                raise
            shutil.rmtree(tmp)  # another unpack of the same digest won the rename
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
