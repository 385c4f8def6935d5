"""What a node does with a shipped workdir before its torchrun, whatever the engine: place it in
the node's cache under its digest, run the job's `setup` once, and remove it when the job ends.

    cache_root/DIGEST/             the workdir, exactly the submitter's selection (launch/workdir)
    cache_root/                    locked (flock on the folder) while a job places, sets up or
                                   removes a workdir; another job waits
    cache_root/DIGEST.setup-HASH   setup HASH (the command's sha256) succeeded on this node
    cache_root/DIGEST.users/JOB    a job using it now; the last one to leave removes it all

The cache is node-local (`~/.cache/gpufleet/workdirs` for the node's user): an unchanged workdir
is neither sent nor set up again, and two jobs of the same workdir on one node share one copy.
Setup runs in the placed folder with `/bin/sh -c`; each line it prints goes to `say` (the job's
log); a non-zero exit raises `SetupFailed`, whose text is the run's failure reason, and leaves no
marker, so the next run tries again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import shutil
import subprocess
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from gpufleet.launch.workdir import unpack

CACHE_ENV = "GPUFLEET_WORKDIR_CACHE"  # overrides the cache root (tests; a site's scratch disk)
DEFAULT_CACHE = "~/.cache/gpufleet/workdirs"
TAIL_LINES = 20  # the last lines of a failed setup carried in its reason
_DIGEST_CHARS = frozenset("0123456789abcdef")
EVERY = "*"  # in place of a digest: every copy the mark is on (`remove_everywhere`)


class WorkdirMissing(RuntimeError):
    """No tar was given and the node does not hold the digest (the driver must send it)."""


class SetupFailed(RuntimeError):
    """The job's setup exited non-zero on a node; the text is the run's failure reason."""

    def __init__(self, node: str, code: int, tail: list[str]):
        self.node, self.code, self.tail = node, code, tail
        last = " | ".join(ln.strip() for ln in tail if ln.strip()) or "(no output)"
        super().__init__(f"setup failed on {node or 'this node'} (exit {code}): {last}")

    def __reduce__(self) -> tuple[type[SetupFailed], tuple[str, int, list[str]]]:
        # raised in a Ray actor and pickled back to the driver: rebuilt from its parts
        return SetupFailed, (self.node, self.code, self.tail)


def cache_root(env: Mapping[str, str] | None = None, home: str | None = None) -> Path:
    """The node's cache of workdirs: $GPUFLEET_WORKDIR_CACHE, else ~/.cache/gpufleet/workdirs.
    `home`: the node user's own home for `~`, where $HOME is not the node's (a Slurm step's
    environment is the submitter's: srun carries it); None: $HOME as usual."""
    env = os.environ if env is None else env
    value = env.get(CACHE_ENV) or DEFAULT_CACHE
    if home is not None and (value == "~" or value.startswith("~/")):
        return Path(home, value[2:])
    return Path(value).expanduser()


def own_home() -> str:
    """This user's home as the node's password database says, whatever $HOME is."""
    return pwd.getpwuid(os.getuid()).pw_dir


def _checked(digest: str) -> str:
    # the digest names a folder: a value from the wire must not be a path
    if len(digest) != 64 or not set(digest) <= _DIGEST_CHARS:
        raise ValueError(f"not a workdir digest: {digest[:80]!r}")
    return digest


def has(root: Path, digest: str) -> bool:
    """Whether this node already holds the workdir (the driver then sends nothing)."""
    return (root / _checked(digest)).is_dir()


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    # One lock for the whole cache, on the folder itself: a lock file per digest could not be
    # removed safely (a waiter would hold the old one while a newcomer made a new one), and
    # `remove` must leave nothing. Jobs sharing a node are rare (nodes are taken whole).
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def setup_marker(root: Path, digest: str, setup: str) -> Path:
    return root / f"{digest}.setup-{hashlib.sha256(setup.encode()).hexdigest()[:16]}"


def _run_setup(folder: Path, setup: str, say: Callable[[str], None], node: str,
               env: Mapping[str, str] | None) -> None:
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(["/bin/sh", "-c", setup], cwd=folder, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ if env is None else env))
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        tail.append(line)
        say(line)
    code = proc.wait()
    if code != 0:
        raise SetupFailed(node, code, list(tail))


def place(root: Path, digest: str, tar_stream: BinaryIO | None, setup: str,
          say: Callable[[str], None], *, node: str = "", user: str = "",
          env: Mapping[str, str] | None = None) -> Path:
    """The workdir `digest` on this node, unpacked from `tar_stream` unless already there, with
    `setup` (a shell command; "" for none) run once per node per digest; `user` (the job) is
    recorded so that `remove` leaves the copy to the jobs still using it. Blocks while another
    job places or sets up the same digest. Raises WorkdirMissing, SetupFailed, UnsafeArchive."""
    folder = root / _checked(digest)
    with _locked(root):
        if tar_stream is not None:
            unpack(tar_stream, folder)
        if not folder.is_dir():
            raise WorkdirMissing(f"workdir {digest[:12]} is not on {node or 'this node'} and "
                                 "was not sent")
        if user:
            users = root / f"{digest}.users"
            users.mkdir(exist_ok=True)
            (users / user.replace("/", "_")).touch()
        _set_up_locked(root, digest, folder, setup, say, node, env)
    return folder


def _set_up_locked(root: Path, digest: str, folder: Path, setup: str,
                   say: Callable[[str], None], node: str, env: Mapping[str, str] | None) -> None:
    marker = setup_marker(root, digest, setup)
    if setup and not marker.exists():
        _run_setup(folder, setup, say, node, env)
        marker.touch()


def set_up(root: Path, digest: str, folder: Path, setup: str, say: Callable[[str], None], *,
           node: str = "", env: Mapping[str, str] | None = None, user: str = "") -> None:
    """`setup` run once per node per digest in `folder`, a workdir the node sees where it is
    (a shared file system: nothing was shipped); the marker is kept in this node's cache.
    `user`: a mark that keeps the marker until `remove` drops it (a Slurm spare's, the job's)."""
    with _locked(root):
        if user:
            users = root / f"{_checked(digest)}.users"
            users.mkdir(exist_ok=True)
            (users / user.replace("/", "_")).touch()
        _set_up_locked(root, _checked(digest), folder, setup, say, node, env)


def remove(root: Path, digest: str, user: str = "") -> bool:
    """A job is done with the workdir: drop its `user` mark, and the copy with its setup
    markers once no job uses it. Returns whether the copy was removed."""
    folder = root / _checked(digest)
    with _locked(root):
        users = root / f"{digest}.users"
        if user:
            (users / user.replace("/", "_")).unlink(missing_ok=True)
        if users.is_dir() and any(users.iterdir()):
            return False
        shutil.rmtree(users, ignore_errors=True)
        for marker in root.glob(f"{digest}.setup-*"):
            marker.unlink(missing_ok=True)
        existed = folder.exists()
        shutil.rmtree(folder, ignore_errors=True)
    return existed


def remove_everywhere(root: Path, user: str) -> list[str]:
    """`remove` for every digest `user` marks in this cache: a job done with its workdir drops
    its mark from the copies of earlier runs too (a workdir the job writes into changes its
    digest from run to run). Returns the digests whose copy or markers went."""
    name = user.replace("/", "_")
    gone = []
    for mark in sorted(root.glob(f"*.users/{name}")) if root.is_dir() else []:
        digest = mark.parent.name.removesuffix(".users")
        if set(digest) <= _DIGEST_CHARS and (remove(root, digest, user)
                                             or not (root / f"{digest}.users").exists()):
            gone.append(digest)
    return gone
