"""Arming the bootstrap inside one worker: the hooks it installs once torch is imported."""

from __future__ import annotations

import atexit
import os
import sys
import time
from types import ModuleType
from typing import Any

from gpufleet.bootstrap import importwatch, layout_seen
from gpufleet.bootstrap.steps import Steps, batch_size

_STEPS: Steps | None = None


def _send(step: int, samples: int | None) -> None:
    from gpufleet.train.report import progress

    progress(step, samples=samples, source="bootstrap")


def _on_optimizer(module: ModuleType) -> None:
    from gpufleet.train.report import SDK, send_event

    steps = _steps()
    steps.stand_down_if = lambda: SDK.used

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if steps.step == 0 and steps.optimizer_id is None and not SDK.used:
                send_event("layout", **layout_seen.describe(optimizer))
            steps.stepped(optimizer)
        except Exception as exc:  # counting must never break a step
            print(f"gpufleet bootstrap: step hook failed: {exc!r}", file=sys.stderr)

    handle = module.register_optimizer_step_post_hook(hook)

    def compiling(dynamo: ModuleType) -> None:
        """A compiled optimizer step (torch.compile) must not trace into our bookkeeping: once
        torch.compile's machinery is imported (it is before anything is compiled), the hook is
        registered again through its `disable`. Not before: importing it takes 1.5 s here, at
        every worker start, in scripts that never compile."""
        nonlocal handle
        disable = getattr(dynamo, "disable", None)
        if disable is not None:
            handle.remove()
            handle = module.register_optimizer_step_post_hook(disable(hook))

    importwatch.when_imported("torch._dynamo", compiling)
    atexit.register(flush)
    send_event("bootstrap")  # this rank will report its steps: judge its health


def _on_dataloader(module: ModuleType) -> None:
    """Count samples and time waiting for data in every DataLoader iterator's `__next__`."""
    import torch

    from gpufleet.train import telemetry

    base = module._BaseDataLoaderIter
    inner = base.__next__
    counters = telemetry.COUNTERS

    from gpufleet.train.report import SDK

    def __next__(self: Any) -> Any:
        if SDK.used:  # the prepared loader times its own waits
            return inner(self)
        started = time.perf_counter()
        batch = inner(self)
        counters.data_wait_s += time.perf_counter() - started
        try:
            size = batch_size(batch)
            if size is not None and torch.is_grad_enabled():  # not an evaluation loop's
                sampler = getattr(getattr(self, "_index_sampler", None), "sampler", None)
                replicas = getattr(sampler, "num_replicas", None)
                _steps().batch(size, replicas if isinstance(replicas, int) else None)
        except Exception:  # an odd batch type: no sample count, the batch goes on
            pass
        return batch

    base.__next__ = __next__


def _steps() -> Steps:
    global _STEPS
    if _STEPS is None:
        _STEPS = Steps(send=_send, world_size=int(os.environ.get("WORLD_SIZE", "1") or 1))
    return _STEPS


def flush() -> None:
    """Report steps held back by the batching (at the script's end)."""
    if _STEPS is not None:
        _STEPS.flush()


ARMED_IN = "GPUFLEET_BOOTSTRAP_PID"


def arm() -> None:
    """Install the hooks (they take effect when the script imports torch), once per rank: a
    process the rank starts (a spawned DataLoader worker, a subprocess) inherits its
    environment, RANK included, but is not the rank, so it neither reports nor writes the
    rank's error file."""
    armed = os.environ.get(ARMED_IN)
    if armed is not None and armed != str(os.getpid()):
        return
    os.environ[ARMED_IN] = str(os.getpid())
    from gpufleet.bootstrap import errorfile

    errorfile.install()
    if not os.environ.get("GPUFLEET_REPORT_ADDR"):
        return
    importwatch.when_imported("torch.optim.optimizer", _on_optimizer)
    importwatch.when_imported("torch.utils.data.dataloader", _on_dataloader)
    layout_seen.watch()
