"""What a worker measures about its own steps, so `report()` can send it without the script
timing anything: time waiting for data (the prepared loader), time with gradient communication
in flight (a DDP communication hook) and bytes communicated, fp16 overflow skips.

Counters accumulate between two `report()` calls and are divided by the steps in between, so a
script that reports every 10th step still gets per-step figures. Everything here is a few
`perf_counter()` calls per step and per bucket; `GPUFLEET_TELEMETRY=0` turns it off (the
benchmark in bench/telemetry_overhead.py compares the two).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

ENABLED = os.environ.get("GPUFLEET_TELEMETRY", "1") != "0"


class Counters:
    def __init__(self) -> None:
        self.data_wait_s = 0.0
        self.comm_s = 0.0
        self.comm_bytes = 0
        self.comm_world = 1  # ranks in the all-reduce, for bus bandwidth
        self._comm_busy_until = 0.0
        self.last: tuple[float, int] | None = None  # (perf_counter, step) at the last report
        self.skipped_steps: int | None = None  # fp16 only
        self.loss_scale: float | None = None

    def comm_done(self, started: float, ended: float, nbytes: int) -> None:
        """Count the union of in-flight intervals: buckets overlap, and a second counted twice
        would report more communication than wall time."""
        self.comm_s += max(0.0, ended - max(started, self._comm_busy_until))
        self._comm_busy_until = max(self._comm_busy_until, ended)
        self.comm_bytes += nbytes

    def take(self, step: int) -> dict[str, float]:
        """Per-step figures since the last call, and start a new interval."""
        now = time.perf_counter()
        out: dict[str, float] = {}
        if self.last is not None and step > self.last[1]:
            steps = step - self.last[1]
            out["step_time_seconds"] = (now - self.last[0]) / steps
            out["data_wait_seconds"] = self.data_wait_s / steps
            if self.comm_bytes:
                out["comm_seconds"] = self.comm_s / steps
                out["comm_bytes"] = self.comm_bytes / steps
                if self.comm_s > 0 and self.comm_world > 1:
                    bus = 2 * (self.comm_world - 1) / self.comm_world  # ring all-reduce traffic
                    out["comm_bandwidth_bytes_per_second"] = self.comm_bytes * bus / self.comm_s
        if self.skipped_steps is not None:
            out["skipped_steps"] = float(self.skipped_steps)
        if self.loss_scale is not None:
            out["loss_scale"] = self.loss_scale
        allocated = _cuda_allocated()
        if allocated is not None:
            out["memory_allocated_bytes"] = float(allocated)
        self.last = (now, step)
        self.data_wait_s = self.comm_s = 0.0
        self.comm_bytes = 0
        return out


COUNTERS = Counters()


def _cuda_allocated() -> int | None:
    """Bytes the caching allocator hands out now: a host-side counter, no device sync."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_allocated())


def timed_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """Yield from a loader's iterator, adding the time each `next()` takes to the data wait."""
    counters = COUNTERS
    while True:
        started = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return
        counters.data_wait_s += time.perf_counter() - started
        yield batch


def install_comm_hook(ddp: Any, group: Any) -> None:
    """Time DDP's gradient communication, from the moment a bucket is ready to the moment its
    reduction completes, without taking DDP's one comm-hook slot from the script.

    DDP accepts one `register_comm_hook` call per model. So nothing is registered here: the
    model's `register_comm_hook` is replaced by one that registers the script's own hook
    (PowerSGD, bf16 compression, ...) wrapped in the timing, and if the script registers none
    by its first forward, DDP's own averaging all-reduce is registered, timed the same way.

    On gloo the completion callback runs when the data has arrived. On NCCL it runs when the
    collective is queued on the stream, so the figure is a lower bound there.
    """
    import torch.distributed as dist

    size = group.size() if group is not None else dist.get_world_size()
    COUNTERS.comm_world = size
    register = ddp.register_comm_hook
    taken = [False]

    def register_timed(state: Any, hook: Any) -> None:
        taken[0] = True
        register(state, _timed(hook))

    def average(state: Any, bucket: Any) -> Any:  # what DDP does without a hook
        buffer = bucket.buffer()
        future = dist.all_reduce(buffer.div_(size), group=state, async_op=True).get_future()
        return future.then(lambda f: f.value()[0])

    def first_forward(_module: Any, _args: Any) -> None:
        pending.remove()
        if not taken[0]:
            register_timed(group, average)

    ddp.register_comm_hook = register_timed
    pending = ddp.register_forward_pre_hook(first_forward)


def _timed(hook: Any) -> Any:
    """`hook` with the time from call to completion and the bucket's bytes counted."""
    import torch
    import torch.distributed as dist

    def timed(state: Any, bucket: Any) -> Any:
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
        started = time.perf_counter()

        def done(f: Any) -> Any:
            COUNTERS.comm_done(started, time.perf_counter(), nbytes)
            return f.value()

        return hook(state, bucket).then(done)

    # DDP checks a hook's annotations against the real classes; postponed annotations (the
    # `from __future__` import above) would be strings, so they are set here explicitly.
    timed.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                             "return": torch.futures.Future[torch.Tensor]}
    return timed
