"""`Checkpointer`: save the whole training state on a cadence, resume from the newest good one.

    ckpt = train.Checkpointer(model, optim, loader=loader, scheduler=sched, every_steps=100)
    start = ckpt.resume()                      # 0 on a fresh run
    for step in range(start + 1, steps + 1):
        ...train one step...
        ckpt.step(step)                        # saves when due (or when the supervisor asks)
    ckpt.close()

What is saved: model and optimizer through torch.distributed.checkpoint (sharded, so a save on
2 ranks loads on 1 or 4), the LR scheduler, the fp16 loss scale, the loader's position in
global samples, the step, each rank's RNG states and any `extra` objects with
`state_dict()`. Where: a fast local folder first (`$GPUFLEET_CHECKPOINT_DIR`, the job's folder
under gpufleet), copied in the background to a durable folder or fsspec URL when one is given.
How: sync or `async_save` (training waits only while the state is copied to CPU memory), with
at most `writers` ranks of a node writing at once, atomically (see ckpt_files); owner-only
unless `shared=True` (ckpt_modes); the durable copy and its failures: ckpt_copy.

Under gpufleet's supervisor the Checkpointer also listens for its requests: "save now" and
"save, then exit" (before an elastic resize). Rank 0 reads the request and broadcasts it over
a gloo group of its own every step, so all ranks act on the same step; that costs one tiny CPU
broadcast per step, and nothing at all when unsupervised and saving by step count only.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from gpufleet.train import ckpt_files as files
from gpufleet.train import ckpt_modes
from gpufleet.train.checkpoint import apply_model_state, engine_of, inner_optimizer, model_state
from gpufleet.train.ckpt_copy import TURN_TIMEOUT_S, DurableCopier
from gpufleet.train.record import record_of
from gpufleet.train.report import send_event

CONTROL_ENV = "GPUFLEET_CONTROL_FILE"
DIR_ENV = "GPUFLEET_CHECKPOINT_DIR"
DURABLE_ENV = "GPUFLEET_CHECKPOINT_TO"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class _TurnWriter(dcp.FileSystemWriter):  # type: ignore[misc]
    """FileSystemWriter that takes its turn (at most `writers` ranks of a node write at once)
    and leaves the checksums of what it wrote before it reports the write done."""

    def __init__(self, folder: Path, rank: int, local_rank: int, writers: int) -> None:
        super().__init__(str(folder))
        self.folder, self.rank, self.local_rank, self.writers = folder, rank, local_rank, writers

    def write_data(self, plan: Any, planner: Any) -> Any:
        files.wait_for(self.folder, files.wave_before(self.local_rank, self.writers),
                       TURN_TIMEOUT_S)
        future = super().write_data(plan, planner)
        results = future.wait()
        files.write_sums(self.folder, self.rank, {r.storage_data.relative_path for r in results})
        files.done_turn(self.folder, self.local_rank)
        return future


def _rng_state() -> dict[str, Any]:
    import numpy as np

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _dist() -> tuple[int, int, int, int, int]:
    """(rank, world, local rank, local world, node rank) from torchrun's environment."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    return (rank, world, _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", world),
            _env_int("GROUP_RANK", 0))


class Checkpointer:
    """Periodic, resumable checkpoints of a prepared model's whole training state. Collective:
    every rank makes one, and calls `resume`, `step`, `save` and `close` at the same points."""

    def __init__(self, model: nn.Module, optimizer: Any = None, *, loader: Any = None,
                 scheduler: Any = None, extra: dict[str, Any] | None = None,
                 dir: str | os.PathLike[str] | None = None, durable: str | None = None,
                 every_steps: int | None = None, every_minutes: float | None = None,
                 async_save: bool = False, keep: int = 3, writers: int | None = None,
                 shared: bool | None = None, log: Callable[[str], None] | None = None) -> None:
        if engine_of(model) is not None:
            raise ValueError("Checkpointer: a DeepSpeed engine keeps its own checkpoint format; "
                             "use train.save_checkpoint / train.load_checkpoint under deepspeed")
        if optimizer is not None:
            inner_optimizer(optimizer)  # refuses zero1 now, not at the first save
        if keep < 1:
            raise ValueError(f"keep: got {keep}; keep at least 1 checkpoint")
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps: got {every_steps}; use 1 or more (or None)")
        if writers is not None and writers < 1:
            raise ValueError(f"writers: got {writers}; use 1 or more (or None: every rank of a "
                             "node at once)")
        if every_minutes is not None and every_minutes <= 0:
            raise ValueError(f"every_minutes: got {every_minutes}; use a positive number (or None)")
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.scheduler, self.extra = scheduler, dict(extra or {})
        self.dir = Path(dir or os.environ.get(DIR_ENV) or "checkpoints").absolute()
        self.durable = durable or os.environ.get(DURABLE_ENV) or None
        if every_steps is None and every_minutes is None:
            every_minutes = 10.0
        self.every_steps, self.every_minutes = every_steps, every_minutes
        self.async_save, self.keep = async_save, keep
        # owner-only folders and files unless shared (ckpt_modes); ValueError for a bad env value
        self.private = not ckpt_modes.shared_from(shared, os.environ)
        self.rank, self.world, self.local_rank, self.local_world, self.node = _dist()
        self.writers = max(1, writers or self.local_world)
        self.control = os.environ.get(CONTROL_ENV) or None
        self._control_last: tuple[tuple[int, int] | None, tuple[int, str]] = (None, (0, ""))
        self._control_seen = self._read_control()[0] if self.control else 0
        self._log = log or (lambda msg: print(f"gpufleet: {msg}", file=sys.stderr, flush=True))
        self.group: Any = None  # the main thread's: flags, barriers, resume verdicts
        self.save_group: Any = None  # DCP's own, which an async save uses from its thread
        if self.world > 1:
            # Gloo groups of our own: an async save runs collectives in a background thread,
            # which must not interleave with training's collectives on the default group, nor
            # with our per-step flag broadcast.
            self.group = dist.new_group(backend="gloo")
            self.save_group = dist.new_group(backend="gloo")
        self._last_save_t = time.monotonic()
        self._pending: tuple[Future[Any], int, Path, float] | None = None
        self.copier = DurableCopier(self.durable, rank=self.rank, world=self.world,
                                    local_world=self.local_world, node=self.node, keep=keep,
                                    private=self.private, log=self._log) \
            if self.durable and self.local_rank == 0 else None
        self.last_saved: int | None = None
        self.blocked_s: list[float] = []  # time training waited, per save (for benchmarks)
        send_event("checkpointer", dir=str(self.dir), every_steps=every_steps,
                   every_minutes=every_minutes, async_save=async_save)

    # -- resume ---------------------------------------------------------------------------------
    def resume(self) -> int:
        """Load the newest intact checkpoint (local, else durable) and return its step; 0 when
        there is none. A corrupt or partial one is skipped with a warning."""
        for step, folder in self._candidates():
            fetched = self._fetch(folder)
            if isinstance(fetched, files.Verdict):
                verdict = fetched
            else:
                folder = fetched
                verdict = files.check(folder, (self.local_rank, self.local_world)) \
                    if folder.is_dir() else files.Verdict(False, "not on this node")
            verdicts = self._gather((verdict.ok, verdict.why))
            bad = [why for ok, why in verdicts if not ok]
            if bad:
                if self.rank == 0:
                    self._log(f"skipping checkpoint {folder}: {bad[0]}")
                    send_event("checkpoint_skipped", step=step, path=str(folder), why=bad[0])
                    if not verdicts[0][0] and folder.is_dir():
                        self._quarantine(folder)
                continue
            self._load(folder)
            self.last_saved = step
            if self.rank == 0:
                self._log(f"resumed from {folder} (step {step})")
                send_event("resumed", step=step, path=str(folder))
            return step
        return 0

    def _candidates(self) -> list[tuple[int, Path]]:
        """Every complete checkpoint rank 0 sees, newest first (local before durable at a tie);
        one list for all ranks, so they try the same ones in the same order."""
        found: list[tuple[int, Path]] = []
        if self.rank == 0:
            found = list(files.complete(self.dir))
            if self.durable and not files.is_url(self.durable):
                found += files.complete(Path(self.durable))
            elif self.durable:
                have = {s for s, _ in found}
                for step, name in files.remote_complete(self.durable):
                    if step not in have:  # fetched into the local folder before loading
                        found.append((step, self.dir / (name + files.PARTIAL)))
            found.sort(key=lambda c: (-c[0], c[1].parent != self.dir))
        chosen: list[tuple[int, Path]] = self._broadcast(found)
        return chosen

    def _fetch(self, folder: Path) -> Path | files.Verdict:
        """A candidate that lives at the durable URL is downloaded (by each node's local rank
        0) into the local folder first; a failed download is a verdict like a bad checksum.
        Collective when it downloads: every rank reaches the same barrier."""
        if not (folder.name.endswith(files.PARTIAL) and self.durable
                and files.is_url(self.durable)):
            return folder
        name = folder.name.removesuffix(files.PARTIAL)
        final = folder.with_name(name)
        failure: files.Verdict | None = None
        if self.local_rank == 0 and not final.is_dir():
            try:
                shutil.rmtree(folder, ignore_errors=True)
                files.fetch(self.durable, name, folder, self.private)
                folder.rename(final)
            except Exception as exc:  # the next candidate may do; say why this one did not
                failure = files.Verdict(False, f"download failed: {type(exc).__name__}: {exc}")
        self._barrier()
        return failure or final

    def _quarantine(self, folder: Path) -> None:
        """Rename a damaged checkpoint out of the way (kept for a look): left as it was, its
        higher step would make pruning delete the new, good checkpoints instead."""
        target = folder.with_name(folder.name + ".corrupt")
        try:
            shutil.rmtree(target, ignore_errors=True)
            folder.rename(target)
        except OSError as exc:
            self._log(f"could not set {folder} aside: {exc}")

    def _load(self, folder: Path) -> None:
        state = model_state(self.model, self.optimizer)
        state["trainer"] = b""  # bytes, not a dict: DCP flattens dicts, and an empty one to nothing
        rng_key = f"rng/{self.rank}"
        manifest = files.manifest_of(folder) or {}
        same_world = manifest.get("world_size") == self.world
        if same_world:
            state[rng_key] = b""
        dcp.load(state, checkpoint_id=str(folder), process_group=self.save_group)
        apply_model_state(self.model, self.optimizer, state)
        trainer = pickle.loads(state["trainer"])
        if self.loader is not None and trainer.get("loader") is not None:
            self.loader.load_state_dict(trainer["loader"])
        if self.scheduler is not None and trainer.get("scheduler") is not None:
            self.scheduler.load_state_dict(trainer["scheduler"])
        scaler = self._scaler()
        if scaler is not None and trainer.get("scaler") is not None:
            scaler.load_state_dict(trainer["scaler"])
        for key, obj in self.extra.items():
            if key in trainer.get("extra", {}):
                obj.load_state_dict(trainer["extra"][key])
        if same_world:
            _set_rng_state(pickle.loads(state[rng_key]))
        elif self.rank == 0:
            self._log(f"the checkpoint was saved on {manifest.get('world_size')} rank(s), this run "
                      f"has {self.world}: weights, optimizer and data position carry over; "
                      "random-number streams start afresh")

    # -- saving ---------------------------------------------------------------------------------
    def step(self, step: int) -> bool:
        """Call after each optimizer step: saves when due, finishes async saves in the
        background; returns True when it saved at this step. If the supervisor asked the job
        to stop for a resize, this saves and ends the process (exit code 0)."""
        self._poll_pending()
        due = self.every_steps is not None and step % self.every_steps == 0
        timed = self.every_minutes is not None and \
            time.monotonic() - self._last_save_t >= self.every_minutes * 60
        exit_after = False
        if self.control is not None or self.every_minutes is not None:
            # rank 0's clock and the supervisor's request decide for everyone
            flags = [int(timed), 0]
            if self.rank == 0 and self.control is not None:
                seq, action = self._read_control()
                if seq > self._control_seen:
                    self._control_seen = seq
                    if action in ("save", "save_exit"):  # anything else cancels nothing: no-op
                        flags = [1, int(action == "save_exit")]
            due_now = self._broadcast_flags(flags)
            due, exit_after = due or bool(due_now[0]), bool(due_now[1])
        if not due or step == self.last_saved:
            if exit_after:
                self._exit(step)
            return False
        self.save(step, sync=exit_after)
        if exit_after:
            self._exit(step)
        return True

    def save(self, step: int, *, sync: bool = False) -> None:
        """Checkpoint now (collective). `sync` forces a blocking save even when async."""
        t0 = time.perf_counter()
        self._finish_pending()  # one save in flight at a time
        partial = self.dir / (files.folder_name(step) + files.PARTIAL)
        if self.rank == 0:  # one remover: where the nodes share the folder (NFS, a test
            # Slurm's nodes on one host), another node's rmtree took the folder rank 0 had just
            # made from under its chmod (FileNotFoundError, seen on 2 Slurm nodes)
            shutil.rmtree(partial, ignore_errors=True)  # left by a crash at this same step
            ckpt_modes.make_dir(partial, self.private)
        self._barrier()
        if self.local_world != self.world:  # more nodes: one with its own disk makes its own
            if self.local_rank == 0 and self.rank != 0:
                ckpt_modes.make_dir(partial, self.private)  # there already where shared
            self._barrier()
        state = model_state(self.model, self.optimizer)
        state["trainer"] = pickle.dumps(self._trainer_state(step))
        state[f"rng/{self.rank}"] = pickle.dumps(_rng_state())
        writer = _TurnWriter(partial, self.rank, self.local_rank, self.writers)
        if self.async_save and not sync:
            future = dcp.async_save(state, storage_writer=writer, process_group=self.save_group)
            assert isinstance(future, Future)
            blocked = time.perf_counter() - t0
            self._pending = (future, step, partial, blocked)
        else:
            dcp.save(state, storage_writer=writer, process_group=self.save_group)
            blocked = time.perf_counter() - t0
            self._completed(step, partial, blocked)
        self.blocked_s.append(blocked)
        self._last_save_t = time.monotonic()

    def _trainer_state(self, step: int) -> dict[str, Any]:
        scaler = self._scaler()
        return {
            "step": step,
            "loader": self.loader.state_dict() if hasattr(self.loader, "state_dict") else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "extra": {k: v.state_dict() for k, v in self.extra.items()},
        }

    def _scaler(self) -> Any:
        rec = record_of(self.model)
        return rec.scaler if rec is not None else None

    def _poll_pending(self) -> None:
        if self._pending is not None and self._pending[0].done():
            self._finish_pending()

    def _finish_pending(self) -> None:
        if self._pending is None:
            return
        future, step, partial, blocked = self._pending
        self._pending = None
        future.result()  # a failed write raises here, in the training loop, where it is seen
        self._completed(step, partial, blocked)

    def _completed(self, step: int, partial: Path, blocked: float) -> None:
        """Every rank's part is written (DCP's finish ran on rank 0 after gathering all
        ranks' results): make the checkpoint visible, prune, start the durable copy."""
        final = partial.with_name(partial.name.removesuffix(files.PARTIAL))
        self.last_saved = step
        if self.local_rank == 0:  # every rank of the node wrote: no file is added after this
            if self.rank == 0:
                files.write_manifest(partial, step, self.world, {"async": self.async_save})
            ckpt_modes.restrict(partial, self.private)
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
            size = sum(p.stat().st_size for p in final.iterdir() if p.is_file())
            send_event("checkpoint", step=step, path=str(final), bytes=size,
                       blocked_s=round(blocked, 4), async_save=self.async_save)
        if self.copier is not None:
            self.copier.submit(final if self.rank == 0 else partial, step)
        if self.local_rank == 0:  # on another node its shards stay here, under the partial name
            files.prune(self.dir, self.keep,
                        protect=set(self.copier.busy) if self.copier is not None else None)

    def wait(self) -> None:
        """Finish the save in flight and the copies to durable storage (collective)."""
        self._finish_pending()
        if self.copier is not None:
            self.copier.join()

    def close(self) -> None:
        """Wait for everything in flight; call once at the end of training (collective)."""
        self.wait()
        self._barrier()

    def _exit(self, step: int) -> None:
        """Stop for the supervisor (a resize): the checkpoint is complete on every rank."""
        self.wait()
        self._barrier()
        if self.rank == 0:
            send_event("exit_for_resize", step=step)
            if self.control is not None:  # a datagram can be lost; the supervisor reads this too
                Path(self.control + ".exited").write_text(str(self._control_seen))
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        if dist.is_initialized():
            dist.destroy_process_group()
        os._exit(0)

    # -- talking to the supervisor and the other ranks ------------------------------------------
    def _read_control(self) -> tuple[int, str]:
        """The supervisor's latest request. Called every step on rank 0, so the file is read
        only when its stat changed (a new request is written by an atomic rename)."""
        assert self.control is not None
        try:
            st = os.stat(self.control)
        except OSError:
            return self._control_last[1]
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp != self._control_last[0]:
            try:
                data = json.loads(Path(self.control).read_text())
                request = (int(data.get("seq", 0)), str(data.get("action", "")))
            except (OSError, ValueError, TypeError, AttributeError):
                request = (0, "")
            self._control_last = (stamp, request)
        return self._control_last[1]

    def _broadcast_flags(self, flags: list[int]) -> list[int]:
        if self.group is None:
            return flags
        t = torch.tensor(flags, dtype=torch.int64)
        dist.broadcast(t, src=0, group=self.group)
        return [int(v) for v in t.tolist()]

    def _broadcast(self, obj: Any) -> Any:
        if self.group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _gather(self, obj: Any) -> list[Any]:
        if self.group is None:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)
