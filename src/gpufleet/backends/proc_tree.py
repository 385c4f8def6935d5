"""Ending process trees on this machine: signals to a list of processes, and a keeper's tree
ended without cutting the keeper's own clean-up short.

A launcher runs under a keeper (backends/keeper.py). Once its launcher has ended, the keeper
kills what the launcher left and then runs its `--after` command: for a job in a container
image, the container's removal (a killed `podman run` client leaves its container behind, and
conmon, re-parented to the keeper as subreaper, dies with the tree, so nothing else would ever
mark it stopped). Whoever ends the tree therefore ends what is *below* the keeper and lets the
keeper finish. Ending the keeper along with the rest, as a stop did before, lost the container
whenever the workers outlasted the stop's grace (a checkpoint saved on SIGTERM, or a loaded
node): the container stayed listed as running on the node for good. The keeper is killed only
if it has not ended by itself within `KEEPER_ENDS_S`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psutil

from gpufleet.backends import keeper

# the keeper's part after its launcher ended: reap and SIGKILL leftovers, then the clean-up
KEEPER_ENDS_S = keeper.REAP_S + keeper.AFTER_S + 10.0


def send_signal(procs: list[Any], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass  # already gone


def terminate(procs: list[Any], grace_s: float) -> None:
    """SIGTERM `procs`, then SIGKILL whichever are still alive after `grace_s` seconds."""
    send_signal(procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    kill(alive)


def kill(procs: list[Any]) -> None:
    """SIGKILL `procs` and reap them (wait up to 5 s)."""
    send_signal(procs, signal.SIGKILL)
    psutil.wait_procs(procs, timeout=5)


def tree(pid: int) -> list[Any]:
    """`pid` and every process below it, parents first; empty once it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def below(pid: int) -> list[Any]:
    return tree(pid)[1:]


def end_kept(pid: int, wait: Callable[[float], int | None], grace_s: float) -> int | None:
    """End the tree of the keeper `pid`: SIGTERM what is below it, SIGKILL what is left after
    `grace_s` (a worker started meanwhile too: a launcher restarting), then wait for the keeper
    to end by itself (`wait(timeout)`: its exit status, None while it runs; the caller's own
    wait, so the status is not reaped from under its Popen). The keeper's exit status, or None
    where even the last-resort SIGKILL left it running."""
    first = below(pid)
    send_signal(first, signal.SIGTERM)
    _, alive = psutil.wait_procs(first, timeout=grace_s)
    kill(list({p.pid: p for p in alive + below(pid)}.values()))
    code = wait(KEEPER_ENDS_S)
    if code is None:
        send_signal(tree(pid)[:1], signal.SIGKILL)
        code = wait(5.0)
    return code
