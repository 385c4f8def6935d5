"""backends.local.nvml_devices against a stand-in NVML: there is no GPU on the machines that run
this suite, so the mapping logic (catalog type, NVLink peers, NVSwitch detection) is checked with a
tiny fake of the pynvml calls it makes. The real NVML path runs on GPU hosts."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from gpufleet.backends.local import nvml_devices

SWITCH = 2
GPU = 0


@dataclass
class _Pci:
    busId: str  # NVML's field name


class NVMLError(Exception):
    pass


def fake_nvml(names: list[str], links: dict[int, list[tuple[int | None, int]]]) -> types.ModuleType:
    """GPUs `names`; links[i] = [(peer index or None for a switch, remote type), ...]."""
    m = types.ModuleType("pynvml")
    bus = [f"00000000:{0x10 + i:02X}:00.0" for i in range(len(names))]
    switch_bus = "00000000:FF:00.0"
    m.NVMLError = NVMLError
    m.NVML_NVLINK_MAX_LINKS = 18
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_DEVICE_TYPE_SWITCH = SWITCH
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(names)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPciInfo = lambda h: _Pci(bus[h])
    m.nvmlDeviceGetName = lambda h: names[h]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * 2**30)

    def link(h: int, n: int) -> tuple[int | None, int]:
        if n >= len(links.get(h, [])):
            raise NVMLError("no such link")
        return links[h][n]

    m.nvmlDeviceGetNvLinkState = lambda h, n: 1 if n < len(links.get(h, [])) else 0

    def remote_pci(h: int, n: int) -> _Pci:
        peer, _ = link(h, n)
        return _Pci(switch_bus if peer is None else bus[peer])

    m.nvmlDeviceGetNvLinkRemotePciInfo = remote_pci
    m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, n: link(h, n)[1]
    return m


def test_pcie_only_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(["NVIDIA GeForce RTX 4090"] * 2, {}))
    devices, fabric = nvml_devices()
    assert fabric == "pcie"
    assert [(d.id, d.index, d.gpu, d.nvlink_peers) for d in devices] == [
        ("gpu0", 0, "RTX4090", ()), ("gpu1", 1, "RTX4090", ())]


def test_nvlink_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    links = {0: [(1, GPU)], 1: [(0, GPU)], 2: [(3, GPU)], 3: [(2, GPU)]}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(["NVIDIA A100-SXM4-40GB"] * 4, links))
    devices, fabric = nvml_devices()
    assert fabric == "nvlink"
    assert [d.nvlink_peers for d in devices] == [(1,), (0,), (3,), (2,)]
    assert {d.gpu for d in devices} == {"A100-40GB"}


def test_nvswitch_connects_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    links = {i: [(None, SWITCH)] * 4 for i in range(8)}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(["NVIDIA H100 80GB HBM3"] * 8, links))
    devices, fabric = nvml_devices()
    assert fabric == "nvswitch"
    assert devices[3].nvlink_peers == (0, 1, 2, 4, 5, 6, 7)
    assert {d.gpu for d in devices} == {"H100-SXM"}


def test_unknown_gpu_is_listed_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(["NVIDIA Mystery 9000"], {}))
    [d], _ = nvml_devices()
    assert d.gpu == "unknown:NVIDIA Mystery 9000" and not d.healthy


def test_no_driver_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    m = fake_nvml([], {})

    def fail() -> None:
        raise NVMLError("driver not loaded")

    m.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", m)
    assert nvml_devices() == ([], "pcie")
