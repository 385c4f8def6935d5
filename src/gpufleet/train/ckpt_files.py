"""Checkpoint folders on disk (or any fsspec URL): naming, manifests, checksums, turns, copies.

A checkpoint is the folder `step-00000050`. It counts only once it holds `manifest.json`,
written last, listing every file with its size, and every rank's `sums-rankN.json` giving the
SHA-256 of the files that rank wrote. So a folder cut short by a crash (no manifest, or a file
missing or shorter) or damaged later (a checksum that no longer matches) is skipped on resume,
never loaded. Locally a checkpoint is also written under a `.partial` name and renamed when
complete, so a listing never shows a half-written one.

No torch.distributed here: the Checkpointer does the collectives and calls these.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.train import ckpt_modes

MANIFEST = "manifest.json"
PARTIAL = ".partial"
_NAME = re.compile(r"step-(\d{8,})")
_CHUNK = 1 << 20


def folder_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    m = _NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def is_url(location: str) -> bool:
    """A location with a scheme (s3://, gs://, memory://, file://) goes through fsspec."""
    return "://" in location


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sums_name(rank: int) -> str:
    return f"sums-rank{rank}.json"


def write_sums(folder: Path, rank: int, files: Iterable[str]) -> None:
    """This rank's checksums for the files it wrote, before it reports its write done."""
    sums = {name: {"size": (folder / name).stat().st_size, "sha256": sha256(folder / name)}
            for name in sorted(set(files))}
    _write_json(folder / sums_name(rank), sums)


def payload(folder: Path) -> list[str]:
    """The checkpoint's own files: data, metadata and sums (not the manifest, not turn markers)."""
    return sorted(p.name for p in folder.iterdir() if p.is_file()
                  and p.name != MANIFEST and not p.name.startswith(".turn-"))


def write_manifest(folder: Path, step: int, world_size: int, extra: dict[str, Any]) -> None:
    """Written last by rank 0, once every rank's data and sums are in the folder."""
    files = {name: (folder / name).stat().st_size for name in payload(folder)}
    _write_json(folder / MANIFEST, {"format": 1, "step": step, "world_size": world_size,
                                    "time": time.time(), "files": files, **extra})


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    why: str = ""


def manifest_of(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def check(folder: Path, share: tuple[int, int] = (0, 1)) -> Verdict:
    """Is this checkpoint complete and intact? Sizes are checked for every file; checksums for
    this caller's share (index, of) of the data files, so ranks split the hashing."""
    manifest = manifest_of(folder)
    if manifest is None:
        return Verdict(False, "no manifest (the write did not finish)")
    files: dict[str, int] = manifest["files"]
    for name, size in files.items():
        try:
            have = (folder / name).stat().st_size
        except OSError:
            return Verdict(False, f"{name} is missing")
        if have != size:
            return Verdict(False, f"{name} has {have} bytes, the manifest says {size}")
    sums: dict[str, dict[str, Any]] = {}
    for name in files:
        if name.startswith("sums-rank"):
            try:
                sums.update(json.loads((folder / name).read_text()))
            except (OSError, ValueError):
                return Verdict(False, f"{name} is unreadable")
    data = sorted(n for n in files if not n.startswith("sums-rank"))
    unsummed = [n for n in data if n not in sums and n != ".metadata"]
    if unsummed:
        return Verdict(False, f"no checksum for {unsummed[0]}")
    index, of = share
    for i, name in enumerate(data):
        if i % of != index or name not in sums:
            continue
        if sha256(folder / name) != sums[name]["sha256"]:
            return Verdict(False, f"checksum mismatch in {name}")
    return Verdict(True)


def complete(root: Path) -> list[tuple[int, Path]]:
    """Checkpoints in `root` that have a manifest, newest first (not yet checksummed)."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        step = step_of(p.name)
        if step is not None and p.is_dir() and (p / MANIFEST).is_file():
            found.append((step, p))
    return sorted(found, reverse=True)


def prune(root: Path, keep: int, protect: set[Path] | None = None) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints, and partial folders left behind,
    except the folders in `protect`. Returns what was deleted."""
    done = complete(root)
    gone = [p for _, p in done[keep:]]
    newest = done[0][0] if done else None
    partials = sorted(((step_of(p.name.removesuffix(PARTIAL)), p) for p in root.iterdir()
                       if p.name.endswith(PARTIAL) and step_of(p.name.removesuffix(PARTIAL))
                       is not None), reverse=True) if root.is_dir() else []
    for i, (step, p) in enumerate(partials):
        # older than the newest complete one (a crash), or beyond `keep` on a node that only
        # ever holds partial folders (its shards of checkpoints finished on rank 0's node)
        if (newest is not None and step is not None and step < newest) or i >= keep:
            gone.append(p)
    gone = [p for p in gone if p not in (protect or set())]  # e.g. still being copied out
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


# --- turns: at most N writers at once ---------------------------------------------------------

def turn_marker(folder: Path, index: int) -> Path:
    return folder / f".turn-{index}"


def wave_before(index: int, writers: int) -> range:
    """The writers that must finish before writer `index` starts, when `writers` write at once:
    all of the previous wave (none for the first). Nobody waits on someone who waits on them."""
    wave = index // writers
    return range((wave - 1) * writers, wave * writers) if wave else range(0)


def wait_for(folder: Path, indices: Iterable[int], timeout_s: float) -> bool:
    """Block until the turn markers of `indices` exist; False if `timeout_s` passed first (a peer
    died mid-write: going on is better than waiting forever)."""
    waiting = [turn_marker(folder, i) for i in indices]
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in waiting):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def done_turn(folder: Path, index: int) -> None:
    turn_marker(folder, index).touch()


# --- durable copies ---------------------------------------------------------------------------

def copy_out(src: Path, dest: str, names: Iterable[str], private: bool = True) -> None:
    """Copy `names` from the checkpoint folder `src` to the location `dest` (a folder, made
    owner-only when `private` (see ckpt_modes), or a URL, whose store decides)."""
    if is_url(dest):
        import fsspec

        fs, path = fsspec.core.url_to_fs(dest)
        fs.makedirs(path, exist_ok=True)
        for name in names:
            fs.put_file(str(src / name), f"{path}/{name}")
        return
    out = Path(dest)
    ckpt_modes.make_dir(out, private)
    for name in names:
        ckpt_modes.copy_file(src / name, out / name, private)


def remote_complete(location: str) -> list[tuple[int, str]]:
    """(step, folder name) of checkpoints with a manifest under an fsspec URL, newest first."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        step = step_of(name)
        if step is not None and fs.exists(f"{root.rstrip('/')}/{name}/{MANIFEST}"):
            found.append((step, name))
    return sorted(found, reverse=True)


def fetch(location: str, name: str, dest: Path, private: bool = True) -> None:
    """Copy the checkpoint `name` under an fsspec URL into the local folder `dest`."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    src = f"{root.rstrip('/')}/{name}"
    ckpt_modes.make_dir(dest, private)
    for entry in fs.ls(src, detail=False):
        leaf = str(entry).rstrip("/").rsplit("/", 1)[-1]
        fs.get_file(f"{src}/{leaf}", str(dest / leaf))
    ckpt_modes.restrict(dest, private)


def remote_prune(location: str, keep: int) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    for _, name in remote_complete(location)[keep:]:
        fs.rm(f"{root.rstrip('/')}/{name}", recursive=True)
