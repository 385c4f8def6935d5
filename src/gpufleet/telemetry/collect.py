"""Device samplers, run by the supervisor once a second: NVML on GPUs, psutil on CPU slots.

They run in the supervisor process, never in a worker, so they cost training nothing but the
CPU time of a few system calls a second. Each returns `Sample`s keyed by the device's position
in the job (0..n-1, the local rank that uses it), labelled with the device's own id.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from gpufleet.launch.warm_rank import rank_in_name


@dataclass(frozen=True)
class Sample:
    key: int  # the device's position in the job's placement: the local rank that uses it
    device: str  # its id in the pool, e.g. "gpu3" or "cpu1"
    name: str  # a device metric from telemetry/schema.py
    value: float


class CpuSampler:
    """Per worker process: CPU time over the cores it was given, and resident memory (with the
    data-loader processes it started).

    Workers are found by the pid they put in their reports, else by the RANK in their
    environment (a script that never imports gpufleet), among the launcher's descendants.
    """

    def __init__(self, devices: list[str], threads_per_worker: int, memory_per_slot: int,
                 rank_var: str = "RANK"):
        self.devices = devices
        self.rank_var = rank_var  # LOCAL_RANK where the sampler sees one node of several
        self.threads = max(1, threads_per_worker)
        self.memory_per_slot = memory_per_slot
        self.pids: dict[int, int] = {}  # rank -> pid
        self._procs: dict[int, psutil.Process] = {}

    def find(self, root_pid: int) -> None:
        """Ranks not yet known, from the environment of the launcher's descendants."""
        if len(self.pids) >= len(self.devices):
            return
        try:
            children = psutil.Process(root_pid).children(recursive=True)
        except psutil.Error:
            return
        known = set(self.pids.values())
        for p in children:
            try:  # a warm rank's environment was set after its fork: its name says it
                rank = p.environ().get(self.rank_var) or rank_in_name(p.name(), self.rank_var)
            except psutil.Error:
                continue
            if rank is not None and rank.isdigit() and int(rank) not in self.pids \
                    and p.pid not in known:
                self.pids[int(rank)] = p.pid

    def sample(self) -> list[Sample]:
        out: list[Sample] = []
        for rank, pid in sorted(dict(self.pids).items()):  # reports may add pids meanwhile
            if rank >= len(self.devices):
                continue
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first call only starts the interval
                    continue
                busy = proc.cpu_percent(None) / 100.0 / self.threads
                rss = proc.memory_info().rss
                for child in proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        rss += child.memory_info().rss
            except psutil.Error:
                self._procs.pop(pid, None)
                continue
            device = self.devices[rank]
            out += [Sample(rank, device, "gpu_utilization", min(1.0, busy)),
                    Sample(rank, device, "gpu_memory_used_bytes", float(rss)),
                    Sample(rank, device, "gpu_memory_total_bytes", float(self.memory_per_slot))]
        return out


class NvmlSampler:
    """Utilization, memory, power, temperature and PCIe/NVLink traffic of the job's GPUs.

    A reading a GPU does not support (power on some boards, NVLink on PCIe cards) is skipped,
    not reported as zero.
    """

    def __init__(self, indices: list[int], devices: list[str], nvml: Any = None,
                 clock: Callable[[], float] = time.monotonic):
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml = nvml
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        self.devices = devices
        self.clock = clock
        self._nvlink_prev: dict[int, tuple[float, float]] = {}  # key -> (time, KiB counter)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()

    def _read(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def sample(self) -> list[Sample]:
        n = self.nvml
        out: list[Sample] = []
        for key, h in enumerate(self.handles):
            device = self.devices[key]

            def add(name: str, value: float | None, key: int = key, device: str = device) -> None:
                if value is not None:
                    out.append(Sample(key, device, name, float(value)))

            util = self._read(n.nvmlDeviceGetUtilizationRates, h)
            add("gpu_utilization", util.gpu / 100.0 if util is not None else None)
            mem = self._read(n.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                add("gpu_memory_used_bytes", mem.used)
                add("gpu_memory_total_bytes", mem.total)
            power = self._read(n.nvmlDeviceGetPowerUsage, h)  # milliwatts
            add("gpu_power_watts", power / 1000.0 if power is not None else None)
            add("gpu_temperature_celsius", self._read(n.nvmlDeviceGetTemperature, h,
                                                      n.NVML_TEMPERATURE_GPU))
            tx = self._read(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)  # KB/s
            rx = self._read(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)
            if tx is not None and rx is not None:
                add("gpu_pcie_bytes_per_second", (tx + rx) * 1024.0)
            add("gpu_nvlink_bytes_per_second", self._nvlink_rate(key, h))
        return out

    def _nvlink_rate(self, key: int, handle: Any) -> float | None:
        """NVLink data sent plus received per second, from NVML's cumulative KiB counters."""
        n = self.nvml
        fields = [getattr(n, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None),
                  getattr(n, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)]
        if None in fields:
            return None
        values = self._read(n.nvmlDeviceGetFieldValues, handle, fields)
        if not values or any(v.nvmlReturn != 0 for v in values):
            return None
        total = float(sum(v.value.ullVal for v in values))
        now = self.clock()
        prev = self._nvlink_prev.get(key)
        self._nvlink_prev[key] = (now, total)
        if prev is None or now <= prev[0] or total < prev[1]:
            return None
        return (total - prev[1]) * 1024.0 / (now - prev[0])
