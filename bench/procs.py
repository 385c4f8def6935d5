"""Process clean-up shared by the benchmarks: they end only what they started, by pid."""

from __future__ import annotations

import signal

import psutil


def end_tree(pid: int) -> None:
    """End a process we started and everything under it, by pid (SIGTERM, then SIGKILL)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
