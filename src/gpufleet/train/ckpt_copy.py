"""The durable copy of each checkpoint (`Checkpointer(durable=...)`), in one background thread.

Copies run one at a time, oldest first, so two never prune each other's folders. To a folder,
nodes copy one after another into `step-N.partial/` and rank 0 copies the manifest last and
renames it; to an fsspec URL every node copies at once and rank 0's manifest makes it count.

A copy that fails (a full volume, a permission, a peer node that never finished) removes what
it wrote: a partial folder left behind would hold the space the next copy needs, so one full
disk would fail every later copy too. It says why in a `checkpoint_copy_failed` note; the
supervisor shows the durable copy as behind until a later copy succeeds (durable_copy.py).
Before each copy rank 0 prunes the durable location to `keep - 1` checkpoints (at least 1), so
the copy needs room for `keep` checkpoints, not `keep + 1`.
"""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from gpufleet.train import ckpt_files as files
from gpufleet.train.report import send_event

TURN_TIMEOUT_S = 600.0


def reason_of(exc: BaseException) -> str:
    """Why a copy failed, in the OS's words when it has them ("No space left on device")."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


class DurableCopier:
    """This node's copies of its checkpoint files to `durable` (a folder or an fsspec URL).
    `rank`, `world`, `local_world`, `node`: torchrun's; `private`: see ckpt_modes."""

    def __init__(self, durable: str, *, rank: int, world: int, local_world: int, node: int,
                 keep: int, private: bool, log: Callable[[str], None]) -> None:
        self.durable, self.rank, self.node, self.keep = durable, rank, node, keep
        self.nodes = max(1, world // max(1, local_world))
        self.private, self._log = private, log
        self._queue: queue.Queue[tuple[Path, int]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.busy: set[Path] = set()  # local folders queued or being copied: not to be pruned

    def submit(self, source: Path, step: int) -> None:
        self.busy.add(source)
        self._queue.put((source, step))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="gpufleet-checkpoint-copy")
            self._thread.start()

    def join(self) -> None:
        """Until every queued copy is done (or failed)."""
        self._queue.join()

    def _loop(self) -> None:
        while True:
            source, step = self._queue.get()
            try:
                self.copy(source, step)
            finally:
                self.busy.discard(source)
                self._queue.task_done()

    def copy(self, source: Path, step: int) -> bool:
        """Copy one checkpoint; False (said in the log and a note) when it failed."""
        name = files.folder_name(step)
        try:
            if files.is_url(self.durable):
                self._to_url(source, name)
            else:
                self._to_folder(source, Path(self.durable), name)
        except Exception as exc:  # the local checkpoint stands; say why the copy did not
            self._discard(name)
            self._log(f"copy of {name} to {self.durable} failed: {type(exc).__name__}: {exc}")
            send_event("checkpoint_copy_failed", step=step, why=reason_of(exc))
            return False
        if self.rank == 0:
            send_event("checkpoint_copied", step=step, path=f"{self.durable.rstrip('/')}/{name}")
        return True

    def _to_folder(self, source: Path, root: Path, name: str) -> None:
        dest = root / (name + files.PARTIAL)
        if self.rank == 0:
            files.prune(root, max(1, self.keep - 1))
        self._wait(dest, files.wave_before(self.node, 1))
        files.copy_out(source, str(dest), files.payload(source), self.private)
        files.done_turn(dest, self.node)
        if self.rank == 0:
            self._wait(dest, range(self.nodes))  # every node copied
            files.copy_out(source, str(dest), [files.MANIFEST], self.private)
            for marker in dest.glob(".turn-*"):
                marker.unlink(missing_ok=True)
            shutil.rmtree(root / name, ignore_errors=True)
            dest.rename(root / name)
            files.prune(root, self.keep)

    def _to_url(self, source: Path, name: str) -> None:
        url = f"{self.durable.rstrip('/')}/{name}"
        if self.rank == 0:
            files.remote_prune(self.durable, max(1, self.keep - 1))
        files.copy_out(source, url, files.payload(source))
        if self.rank == 0:
            files.copy_out(source, url, [files.MANIFEST])
            files.remote_prune(self.durable, self.keep)

    def _wait(self, dest: Path, nodes: range) -> None:
        """The turn markers of `nodes`; a node that failed or died never leaves one, and
        going on would publish a checkpoint without its files."""
        if not files.wait_for(dest, nodes, TURN_TIMEOUT_S):
            raise TimeoutError(f"node(s) {list(nodes)} did not finish copying to {dest} in "
                               f"{TURN_TIMEOUT_S:.0f} s")

    def _discard(self, name: str) -> None:
        """What a failed copy wrote: the partial folder, or (rank 0) the folder at the URL
        while it has no manifest (so does not count), which holds space all the same."""
        try:
            if not files.is_url(self.durable):
                shutil.rmtree(Path(self.durable) / (name + files.PARTIAL), ignore_errors=True)
            elif self.rank == 0:
                import fsspec

                fs, root = fsspec.core.url_to_fs(self.durable)
                folder = f"{root.rstrip('/')}/{name}"
                if fs.exists(folder) and not fs.exists(f"{folder}/{files.MANIFEST}"):
                    fs.rm(folder, recursive=True)
        except Exception as exc:  # cleaning up must not hide the failure it cleans up after
            self._log(f"could not remove the failed copy of {name}: {exc}")
