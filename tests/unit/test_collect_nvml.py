"""telemetry.collect.NvmlSampler against a stand-in NVML (no GPU here): units, the job's device
keys, readings a board does not support left out, NVLink rates from cumulative counters."""

from __future__ import annotations

import types

import pytest

from gpufleet.telemetry.collect import NvmlSampler


class NVMLError(Exception):
    pass


def fake_nvml(nvlink_kib: list[float], power: bool = True) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_PCIE_UTIL_TX_BYTES, m.NVML_PCIE_UTIL_RX_BYTES = 0, 1
    m.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, m.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=40 + h, memory=10)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2**30,
                                                                 total=80 * 2**30)

    def power_usage(h: int) -> int:
        if not power:
            raise NVMLError("not supported")
        return 350_500  # milliwatts

    m.nvmlDeviceGetPowerUsage = power_usage
    m.nvmlDeviceGetTemperature = lambda h, sensor: 61
    m.nvmlDeviceGetPcieThroughput = lambda h, kind: 1000 if kind == 0 else 500  # KB/s
    reads = iter(nvlink_kib)

    def fields(h: int, ids: list[int]) -> list[types.SimpleNamespace]:
        total = next(reads)
        return [types.SimpleNamespace(nvmlReturn=0, value=types.SimpleNamespace(ullVal=total / 2))
                for _ in ids]

    m.nvmlDeviceGetFieldValues = fields
    return m


def by_name(samples: list, key: int) -> dict[str, float]:  # type: ignore[type-arg]
    return {s.name: s.value for s in samples if s.key == key}


def test_units_and_keys() -> None:
    sampler = NvmlSampler([5, 6], ["gpu5", "gpu6"], nvml=fake_nvml([0, 0, 1e6, 1e6]))
    first = sampler.sample()
    g0 = by_name(first, 0)
    assert g0["gpu_utilization"] == pytest.approx(0.45)  # NVML's GPU 5, the job's device 0
    assert g0["gpu_memory_used_bytes"] == 6 * 2**30 and g0["gpu_memory_total_bytes"] == 80 * 2**30
    assert g0["gpu_power_watts"] == pytest.approx(350.5)
    assert g0["gpu_temperature_celsius"] == 61
    assert g0["gpu_pcie_bytes_per_second"] == 1500 * 1024
    assert "gpu_nvlink_bytes_per_second" not in g0  # a rate needs two readings
    assert {s.device for s in first if s.key == 1} == {"gpu6"}


def test_nvlink_rate_from_two_readings() -> None:
    times = iter([100.0, 102.0])
    sampler = NvmlSampler([0], ["gpu0"], nvml=fake_nvml([1000.0, 1000.0 + 2048.0]),
                          clock=lambda: next(times))
    sampler.sample()
    second = by_name(sampler.sample(), 0)
    # 2,048 KiB more (sent plus received) over 2 s: 1 MiB/s
    assert second["gpu_nvlink_bytes_per_second"] == 2048 * 1024 / 2


def test_unsupported_readings_are_left_out_not_zero() -> None:
    sampler = NvmlSampler([0], ["gpu0"], nvml=fake_nvml([0, 0], power=False))
    assert "gpu_power_watts" not in by_name(sampler.sample(), 0)
