"""Progress for a script that never calls `gpufleet.train.report`: its optimizer steps.

torch calls every global optimizer step post-hook after any optimizer's `step()`, so counting
them needs no change to the script. One optimizer is followed (the first that steps; a GAN's
second would count each step twice). Samples come from the DataLoaders the script iterates
(the first dimension of each batch, times the world size: DistributedSampler gives every rank
the same count); a script without a DataLoader (nanoGPT) reports steps only.

`Steps` is the pure part: the clock and the sender are passed in, so it is tested without torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Reports are cheap (one UDP datagram) but a script stepping 1000 times a second would still pay
# for each; faster than this, steps are reported in batches (the per-step figures are averages).
MIN_INTERVAL_S = 0.25

Send = Callable[[int, "int | None"], None]  # (step, samples since the last report or None)


@dataclass
class Steps:
    """Counts steps of one optimizer and decides when to report."""

    send: Send
    clock: Callable[[], float] = time.monotonic
    world_size: int = 1
    optimizer_id: int | None = None
    step: int = 0
    pending_samples: int = 0
    saw_samples: bool = False
    last_sent: float | None = None
    sent_step: int = 0  # the last step reported
    stood_down: bool = False
    stand_down_if: Callable[[], bool] = field(default=lambda: False)

    others: int = 0  # steps of another optimizer since the followed one last stepped
    replicas: int | None = None  # ranks sharing out the data (a DistributedSampler says)

    def batch(self, size: int, replicas: int | None = None) -> None:
        """A training DataLoader on this rank yielded a batch of `size` samples; `replicas`:
        over how many ranks its DistributedSampler splits the data (the data-parallel degree,
        which under tensor or pipeline parallelism is less than the world size)."""
        self.pending_samples += size
        self.saw_samples = True
        if replicas is not None:
            self.replicas = replicas

    def stepped(self, optimizer: Any) -> None:
        if self.stood_down:
            return
        if self.stand_down_if():  # the script reports through the SDK: its figures win
            self.stood_down = True
            return
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        elif id(optimizer) != self.optimizer_id:
            # a GAN's second optimizer alternates with the first: not counted. One that steps
            # twice in a row while the followed one does not has replaced it (a script that
            # rebuilds its optimizer, e.g. after unfreezing layers): follow it from now on.
            self.others += 1
            if self.others < 2:
                return
            self.optimizer_id = id(optimizer)
        self.others = 0
        self.step += 1
        now = self.clock()
        if self.last_sent is not None and now - self.last_sent < MIN_INTERVAL_S:
            return
        self._send(now)

    def flush(self) -> None:
        """Report the last steps if they were held back (at exit: a fast script's final step
        would otherwise never reach the job). Never raises: it runs from atexit."""
        try:
            if not self.stood_down and self.step > self.sent_step and not self.stand_down_if():
                self._send(self.clock())
        except Exception:
            pass

    def _send(self, now: float) -> None:
        ranks = self.replicas if self.replicas is not None else self.world_size
        samples = self.pending_samples * ranks if self.saw_samples else None
        self.pending_samples = 0
        self.last_sent, self.sent_step = now, self.step
        self.send(self.step, samples)


def batch_size(batch: Any, depth: int = 0) -> int | None:
    """The first dimension of the first tensor in a batch (a tensor, a tuple/list of them, a dict
    such as a tokenizer's output), or None when there is none."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) > 0 else None
    if depth > 3:
        return None
    if isinstance(batch, dict):
        items: Any = batch.values()
    elif isinstance(batch, list | tuple):
        items = batch
    else:
        return None
    for item in items:
        size = batch_size(item, depth + 1)
        if size is not None:
            return size
    return None
