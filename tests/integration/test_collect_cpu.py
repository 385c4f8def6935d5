"""telemetry.collect.CpuSampler on real processes: a busy worker and an idle one, found by the
RANK in their environment as the supervisor finds a script's workers."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from gpufleet.telemetry.collect import CpuSampler

BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"
IDLE = "import time; time.sleep(30)"


def test_busy_and_idle_workers_are_told_apart() -> None:
    parent = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys, time\n"
        f"kids = [subprocess.Popen([sys.executable, '-c', {BUSY!r}], env=dict(os.environ, RANK='0')),\n"
        f"        subprocess.Popen([sys.executable, '-c', {IDLE!r}], env=dict(os.environ, RANK='1'))]\n"
        "[k.wait() for k in kids]")])
    try:
        sampler = CpuSampler(["cpu0", "cpu1"], threads_per_worker=1, memory_per_slot=1 << 30)
        deadline = time.monotonic() + 10
        while len(sampler.pids) < 2 and time.monotonic() < deadline:
            sampler.find(parent.pid)
            time.sleep(0.1)
        assert set(sampler.pids) == {0, 1}
        sampler.sample()  # starts the CPU interval
        # A series of intervals, judged by their best: a spinning worker gets the share of a core
        # the machine's load leaves it (0.42 next to two other busy processes on 2 cores, about
        # 2/L at a load average of L: 0.11 at 18), a sleeping one none at all, whatever the
        # load; so the verdict is relative, above one clock tick (0.02 of 0.5 s) at least twice.
        series = []
        for _ in range(5):
            time.sleep(0.5)
            series.append({(s.device, s.name): s.value for s in sampler.sample()})
        got = series[-1]
        busy = max(g[("cpu0", "gpu_utilization")] for g in series)
        idle = max(g[("cpu1", "gpu_utilization")] for g in series)
        assert idle < 0.05, series
        assert busy > 0.04 and busy > 5 * idle, series
        assert got[("cpu0", "gpu_memory_used_bytes")] > 1 << 20
        assert got[("cpu1", "gpu_memory_total_bytes")] == 1 << 30
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()  # ours: started just above
        parent.kill()
        parent.wait()
