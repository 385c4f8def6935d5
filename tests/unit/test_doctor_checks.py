"""The doctor's checks against hand-made facts: GPU hosts (4 GPUs with NVLink pairs, an NVSwitch
box, a driver too old for torch's CUDA), Docker-sized /dev/shm, a 1024 open-file limit, NCCL
settings naming missing interfaces. The NVML gathering is run against a stand-in module, since
the machines that run this suite have no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from dataclasses import dataclass, replace
from typing import Any

import pytest

from gpufleet.doctor import checks
from gpufleet.doctor.command import default_target
from gpufleet.doctor.facts import gpu_type_facts, job_env, nvml_facts
from gpufleet.doctor.model import (
    GIB,
    MIB,
    RESULT_MARKER,
    AllReduceRun,
    Check,
    Disk,
    GpuTypeFacts,
    NodeFacts,
    Shm,
    Target,
    Topology,
    Versions,
)
from gpufleet.pool.model import Device, Node

IFACES = frozenset({"lo", "eth0", "docker0"})


def cpu_devices(n: int) -> tuple[Device, ...]:
    return tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=0) for i in range(n))


def gpu_devices(n: int, gpu: str = "H100-SXM", healthy: bool = True) -> tuple[Device, ...]:
    return tuple(Device(id=f"gpu{i}", index=i, gpu=gpu, memory_bytes=80 * GIB, healthy=healthy)
                 for i in range(n))


def worker_line(rank: int, world: int, seconds: float = 0.001, wrong: int = 0) -> str:
    want = world * (world + 1) / 2
    got = want if not wrong else want - 1
    sums = [{"bytes": b, "want": want, "got_min": got, "got_max": want, "wrong": wrong}
            for b in (4, 4 * MIB)]
    return RESULT_MARKER + json.dumps({"rank": rank, "world": world, "sums": sums,
                                       "timed_bytes": 4 * MIB, "iterations": 10,
                                       "seconds_per_iter": seconds})


def good_run(world: int = 2, backend: str = "gloo") -> AllReduceRun:
    return AllReduceRun(world, backend, 0, False, 120.0,
                        tuple(worker_line(r, world) for r in range(world)))


CPU_VERSIONS = Versions(None, None, "2.13.0+cpu", None, False, None, False, True)
GPU_VERSIONS = Versions("550.54.15", "12.4", "2.13.0+cu124", "12.4", True, "2.21.5", True, True)


def cpu_facts(**changes: Any) -> NodeFacts:
    base = NodeFacts(
        target=Target("local", None, "cpu", "pcie", cpu_devices(2)), visible=cpu_devices(2),
        nvml_error="NVML Shared Library Not Found", cpu_count=2, versions=CPU_VERSIONS,
        gpu_types=(), cpu_flags=frozenset({"avx2"}), topology=None, env={}, interfaces=IFACES,
        shm=Shm("/dev/shm", 16 * GIB, 16 * GIB), nofile_soft=65536, nofile_hard=65536,
        disk=Disk("/home/u/.gpufleet", 500 * GIB), allreduce=good_run(),
    )
    return replace(base, **changes)


def dgx_pairs_topology() -> Topology:
    """4 GPUs: NVLink pairs 0-1 and 2-3 (4 links each); 0/1 and 2/3 sit under different CPU
    sockets, like an 'NVLink bridge' workstation with two pairs."""
    levels = {(0, 1): "PIX", (2, 3): "PIX", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS",
              (1, 3): "SYS"}
    nvlinks = {(0, 1): 4, (2, 3): 4}
    return Topology((0, 1, 2, 3), levels, nvlinks)


def gpu_facts(n: int = 4, network: str = "nvlink", cluster: str | None = "llama",
              **changes: Any) -> NodeFacts:
    base = cpu_facts(
        target=Target("local", cluster, "H100-SXM", network, gpu_devices(n)),
        visible=gpu_devices(n) + cpu_devices(2), nvml_error=None, cpu_count=64,
        versions=GPU_VERSIONS, gpu_types=(GpuTypeFacts("H100-SXM", True, True),),
        topology=dgx_pairs_topology(), allreduce=good_run(n, "nccl"),
    )
    return replace(base, **changes)


# -- devices -----------------------------------------------------------------------------------------
def test_devices_without_cluster_report_what_is_visible() -> None:
    c = checks.devices(cpu_facts())
    assert c.status == "pass" and "no GPU" in c.detail and "2 gloo workers" in c.detail
    c = checks.devices(gpu_facts(cluster=None))
    assert c.status == "pass" and "4 GPUs visible" in c.detail and c.fix == ""


def test_devices_unknown_gpu_type_warns() -> None:
    odd = gpu_devices(2, gpu="unknown:NVIDIA Mystery 9000", healthy=False)
    c = checks.devices(gpu_facts(cluster=None, visible=odd))
    assert c.status == "warn" and "gpus.csv" in c.fix


def test_devices_cpu_cluster() -> None:
    target = Target("local", "c1", "cpu", "pcie", cpu_devices(2))
    assert checks.devices(cpu_facts(target=target)).status == "pass"
    # the host now offers fewer slots than the cluster holds: slots are a count, so only a warning
    c = checks.devices(cpu_facts(target=target, visible=cpu_devices(1)))
    assert c.status == "warn" and "cpu1" in c.detail and "GPUFLEET_CPU_SLOTS" in c.fix
    big = Target("local", "c1", "cpu", "pcie", cpu_devices(4))
    c = checks.devices(cpu_facts(target=big, visible=cpu_devices(4)))
    assert c.status == "warn" and "4 workers on 2 cores" in c.detail


def test_devices_gpu_cluster_all_visible() -> None:
    c = checks.devices(gpu_facts())
    assert c.status == "pass" and "gpu0, gpu1, gpu2, gpu3" in c.detail


def test_devices_gpu_missing_or_changed_fails() -> None:
    c = checks.devices(gpu_facts(visible=gpu_devices(3)))
    assert c.status == "fail" and "not visible: gpu3" in c.detail and "nvidia-smi" in c.fix
    swapped = (*gpu_devices(3), Device("gpu3", 3, "RTX4090", 24 * GIB))
    c = checks.devices(gpu_facts(visible=swapped))
    assert c.status == "fail" and "gpu3 is RTX4090, not H100-SXM" in c.detail


def test_devices_gpu_cluster_without_nvml_fails() -> None:
    c = checks.devices(gpu_facts(visible=cpu_devices(2), nvml_error="Driver Not Loaded"))
    assert c.status == "fail" and "Driver Not Loaded" in c.detail


# -- versions --------------------------------------------------------------------------------------
def test_versions_cpu_passes_with_gloo() -> None:
    c = checks.versions(cpu_facts())
    assert c.status == "pass" and c.detail.startswith("no GPU: gloo on CPU")
    c = checks.versions(cpu_facts(versions=replace(CPU_VERSIONS, gloo_available=False)))
    assert c.status == "fail"


def test_versions_gpu_pass() -> None:
    c = checks.versions(gpu_facts())
    assert c.status == "pass"
    assert "driver 550.54.15 (CUDA 12.4)" in c.detail and "NCCL 2.21.5" in c.detail
    assert c.data["nccl"] == "2.21.5"


def test_driver_too_old_for_torch_cuda_fails() -> None:
    old = replace(GPU_VERSIONS, driver="470.82.01", cuda_driver="11.4", torch_cuda="12.8")
    c = checks.versions(gpu_facts(versions=old))
    assert c.status == "fail" and "torch needs CUDA 12.8" in c.detail
    assert "upgrade the NVIDIA driver" in c.fix


def test_newer_minor_cuda_runs_under_minor_version_compatibility() -> None:
    c = checks.versions(gpu_facts(versions=replace(GPU_VERSIONS, torch_cuda="12.8")))
    assert c.status == "warn" and "minor-version compatibility" in c.detail


def test_versions_gpu_with_cpu_torch_or_no_cuda_fails() -> None:
    c = checks.versions(gpu_facts(versions=replace(GPU_VERSIONS, torch_cuda=None)))
    assert c.status == "fail" and "CPU build" in c.detail
    c = checks.versions(gpu_facts(versions=replace(GPU_VERSIONS, cuda_available=False)))
    assert c.status == "fail" and "is_available" in c.detail
    c = checks.versions(gpu_facts(versions=replace(GPU_VERSIONS, nccl_available=False)))
    assert c.status == "fail" and "no NCCL" in c.detail


# -- bf16 ------------------------------------------------------------------------------------------
def test_bf16_cpu_is_informational() -> None:
    c = checks.bf16(cpu_facts())
    assert c.status == "pass" and "emulated" in c.detail
    c = checks.bf16(cpu_facts(cpu_flags=frozenset({"avx512f", "amx_bf16"})))
    assert c.status == "pass" and "natively (amx_bf16)" in c.detail


def test_bf16_gpu() -> None:
    assert checks.bf16(gpu_facts()).status == "pass"
    v100 = checks.bf16(gpu_facts(gpu_types=(GpuTypeFacts("V100", False, False),)))
    assert v100.status == "warn" and "V100 has no bf16" in v100.detail
    assert "--precision fp16-mixed" in v100.fix and "loss scaling" in v100.fix
    mismatch = checks.bf16(gpu_facts(gpu_types=(GpuTypeFacts("A100-80GB", True, False),)))
    assert mismatch.status == "warn" and "catalog says bf16" in mismatch.detail
    unknown = checks.bf16(gpu_facts(gpu_types=(GpuTypeFacts("NVIDIA Mystery 9000", None, True),)))
    assert unknown.status == "warn" and "not in the catalog" in unknown.detail
    unconfirmed = checks.bf16(gpu_facts(gpu_types=(GpuTypeFacts("H100-SXM", True, None),)))
    assert unconfirmed.status == "pass" and "CUDA unavailable" in unconfirmed.detail


def test_gpu_type_facts_join_catalog_and_device() -> None:
    target = Target("local", None, "V100", "pcie", gpu_devices(2, gpu="V100"))
    [g] = gpu_type_facts(target, target.devices, {"Tesla V100-SXM2-32GB": False})
    assert g == GpuTypeFacts("V100", False, False)
    odd = gpu_devices(1, gpu="unknown:NVIDIA Mystery 9000", healthy=False)
    t2 = Target("local", None, odd[0].gpu, "pcie", odd)
    assert gpu_type_facts(t2, odd, {"NVIDIA Mystery 9000": True}) == (
        GpuTypeFacts("NVIDIA Mystery 9000", None, True),)


# -- topology --------------------------------------------------------------------------------------
def test_topology_matrix_like_nvidia_smi() -> None:
    c = checks.topology(gpu_facts(network="pcie"))
    assert c.status == "pass"
    assert c.data["gpus"] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert c.data["matrix"] == [
        ["X", "NV4", "SYS", "SYS"],
        ["NV4", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NV4"],
        ["SYS", "SYS", "NV4", "X"],
    ]
    assert "6 pairs: 2 NV4, 4 SYS" in c.detail


def test_topology_warns_when_nvlink_is_declared_but_missing() -> None:
    c = checks.topology(gpu_facts(network="nvlink"))
    assert c.status == "warn" and "declared nvlink" in c.detail
    assert "gpu0-gpu2 SYS" in c.detail and "SYS: the link between CPU sockets" in c.detail
    # a cluster of one NVLinked pair is fine
    pair = Target("local", "pair", "H100-SXM", "nvlink", gpu_devices(2))
    assert checks.topology(gpu_facts(target=pair)).status == "pass"


def test_topology_nvswitch_and_edge_cases() -> None:
    full = Topology(tuple(range(8)), {}, {(i, j): 18 for i in range(8) for j in range(i + 1, 8)})
    c = checks.topology(gpu_facts(n=8, network="nvswitch", topology=full))
    assert c.status == "pass" and "28 pairs: 28 NV18" in c.detail
    assert checks.topology(gpu_facts(n=1)).status == "pass"
    assert checks.topology(gpu_facts(topology=None)).status == "warn"
    assert checks.topology(cpu_facts()).detail == "CPU slots: shared memory"


@dataclass
class _Pci:
    busId: str  # NVML's field name


class _NVMLError(Exception):
    pass


def fake_nvml(n: int, links: dict[int, list[int | None]], levels: dict[tuple[int, int], int]) -> Any:
    """n GPUs; links[i] lists each NVLink's far end (a GPU index, or None for an NVSwitch)."""
    m = types.SimpleNamespace()
    bus = [f"00000000:{0x10 + i:02X}:00.0" for i in range(n)]
    m.NVMLError = _NVMLError
    m.NVML_NVLINK_MAX_LINKS = 18
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPciInfo = lambda h: _Pci(bus[h])
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: levels[(min(a, b), max(a, b))]

    def far(h: int, k: int) -> int | None:
        if k >= len(links.get(h, [])):
            raise _NVMLError("no such link")
        return links[h][k]

    m.nvmlDeviceGetNvLinkState = lambda h, k: 1 if k < len(links.get(h, [])) else 0
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, k: _Pci(
        "00000000:FF:00.0" if far(h, k) is None else bus[far(h, k)])  # type: ignore[index]
    m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, k: 2 if far(h, k) is None else 0
    return m


def test_nvml_facts_read_versions_levels_and_nvlinks() -> None:
    levels = {(0, 1): 10, (2, 3): 20, (0, 2): 50, (0, 3): 50, (1, 2): 40, (1, 3): 30}
    links: dict[int, list[int | None]] = {0: [1, 1], 1: [0, 0], 2: [3], 3: [2]}
    f = nvml_facts(fake_nvml(4, links, levels))
    assert (f.error, f.driver, f.cuda_driver) == (None, "550.54.15", "12.4")
    assert f.topology is not None
    assert checks.topology_matrix(f.topology, (0, 1, 2, 3)) == [
        ["X", "NV2", "SYS", "SYS"],
        ["NV2", "X", "NODE", "PHB"],
        ["SYS", "NODE", "X", "NV1"],
        ["SYS", "PHB", "NV1", "X"],
    ]


def test_nvml_facts_through_an_nvswitch() -> None:
    levels = {(i, j): 40 for i in range(4) for j in range(i + 1, 4)}
    f = nvml_facts(fake_nvml(4, {i: [None] * 18 for i in range(4)}, levels))
    assert f.topology is not None and set(f.topology.nvlinks.values()) == {18}


def test_nvml_facts_without_a_driver() -> None:
    m = fake_nvml(0, {}, {})

    def fail() -> None:
        raise _NVMLError("Driver Not Loaded")

    m.nvmlInit = fail
    assert nvml_facts(m).error == "Driver Not Loaded"


# -- NCCL / gloo environment -----------------------------------------------------------------------
def nccl(env: dict[str, str], network: str = "pcie", on_gpu: bool = True) -> Check:
    facts = gpu_facts(network=network, env=env) if on_gpu else cpu_facts(env=env)
    return checks.nccl_env(facts)


def test_nccl_socket_ifname_missing_interface_fails() -> None:
    c = nccl({"NCCL_SOCKET_IFNAME": "nosuchif0"})
    assert c.status == "fail" and "no interface matches" in c.detail
    assert "eth0" in c.fix and "NCCL_SOCKET_IFNAME" in c.fix


@pytest.mark.parametrize(("value", "status"), [
    ("^lo,docker", "pass"),  # the infiniband/ethernet presets: exclusion syntax
    ("eth", "pass"),  # a prefix matches eth0
    ("=eth0", "pass"),
    ("=eth", "fail"),  # exact: there is no interface named 'eth'
    ("^=eth0,lo,docker0", "fail"),  # excludes every interface
    ("eth0,ib0", "warn"),  # one of two exists
])
def test_nccl_socket_ifname_syntax(value: str, status: str) -> None:
    assert nccl({"NCCL_SOCKET_IFNAME": value}).status == status


def test_gloo_socket_ifname_takes_exact_names() -> None:
    assert nccl({"GLOO_SOCKET_IFNAME": "eth0"}).status == "pass"
    assert nccl({"GLOO_SOCKET_IFNAME": "eth"}).status == "fail"
    c = nccl({"GLOO_SOCKET_IFNAME": "^lo"})
    assert c.status == "fail" and "exact names" in c.detail


def test_nccl_flags_and_debug_levels() -> None:
    c = nccl({"NCCL_IB_DISABLE": "true"})
    assert c.status == "fail" and "not 0 or 1" in c.detail
    assert nccl({"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "0", "NCCL_DEBUG": "info"}).status == "pass"
    c = nccl({"NCCL_DEBUG": "verbose"})
    assert c.status == "warn" and "VERSION, WARN, INFO, TRACE" in c.detail
    c = nccl({"NCCL_P2P_DISABLE": "1"}, network="nvlink")
    assert c.status == "warn" and "NVLink off" in c.detail
    assert nccl({"NCCL_P2P_DISABLE": "1"}, network="pcie").status == "pass"
    assert nccl({"NCCL_IB_DISABLE": "1"}, network="infiniband").status == "warn"
    assert nccl({"NCCL_P2P_LEVEL": "NVL"}).status == "pass"
    assert nccl({"NCCL_P2P_LEVEL": "fast"}).status == "warn"
    assert nccl({}).detail.startswith("no NCCL_*/GLOO_* settings")


def test_nccl_on_cpu_still_fails_and_says_why_it_matters() -> None:
    c = nccl({"NCCL_SOCKET_IFNAME": "nosuchif0"}, on_gpu=False)
    assert c.status == "fail" and "gloo on CPU ignores NCCL_*" in c.detail


def test_job_env_presets_pass_and_user_settings_win() -> None:
    ib = Target("local", "big", "H100-SXM", "infiniband", gpu_devices(8))
    env = job_env(ib, {"PATH": "/bin"}, host_cpus=64)
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker" and env["NCCL_IB_DISABLE"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and env["GPUFLEET_BACKEND"] == "nccl"
    assert env["GPUFLEET_CLUSTER"] == "big"
    assert checks.nccl_env(gpu_facts(target=ib, env=env)).status == "pass"
    mine = job_env(ib, {"NCCL_SOCKET_IFNAME": "nosuchif0"}, host_cpus=64)
    assert mine["NCCL_SOCKET_IFNAME"] == "nosuchif0"
    cpu = job_env(default_target(Node("local", "127.0.0.1", cpu_devices(2))), {}, host_cpus=2)
    assert cpu["GPUFLEET_BACKEND"] == "gloo" and cpu["CUDA_VISIBLE_DEVICES"] == ""


# -- host limits -----------------------------------------------------------------------------------
def test_shm() -> None:
    docker = checks.shm(cpu_facts(shm=Shm("/dev/shm", 64 * MIB, 64 * MIB)))
    assert docker.status == "fail" and "--shm-size=16g" in docker.fix and "--ipc=host" in docker.fix
    small = checks.shm(cpu_facts(shm=Shm("/dev/shm", 512 * MIB, 512 * MIB)))
    assert small.status == "warn" and "--shm-size" in small.fix
    full = checks.shm(cpu_facts(shm=Shm("/dev/shm", 32 * GIB, 100 * MIB)))
    assert full.status == "fail" and "crashed jobs" in full.fix
    assert checks.shm(cpu_facts()).status == "pass"
    assert checks.shm(cpu_facts(shm=None)).status == "warn"


def test_open_files() -> None:
    c = checks.open_files(cpu_facts(nofile_soft=1024, nofile_hard=1048576))
    assert c.status == "warn" and c.fix.startswith("`ulimit -n 65536`")
    c = checks.open_files(cpu_facts(nofile_soft=256, nofile_hard=4096))
    assert c.status == "fail" and "limits.conf" in c.fix
    assert checks.open_files(cpu_facts(nofile_soft=65536)).status == "pass"


def test_disk() -> None:
    assert checks.disk(cpu_facts(disk=Disk("/h", 1 * GIB))).status == "fail"
    warn = checks.disk(cpu_facts(disk=Disk("/h", 10 * GIB)))
    assert warn.status == "warn" and "GPUFLEET_HOME" in warn.fix
    assert checks.disk(cpu_facts()).status == "pass"
    broken = checks.disk(cpu_facts(disk=Disk("/ro/home", None, "GPUFLEET_HOME: cannot use")))
    assert broken.status == "fail" and "cannot use" in broken.detail


# -- all-reduce ------------------------------------------------------------------------------------
def test_allreduce_pass_reports_bus_bandwidth() -> None:
    # torchrun's prefix in front of a worker line must not hide it
    lines = tuple(f"[rank{r}]:" + worker_line(r, 4, seconds=0.002) for r in range(4))
    c = checks.allreduce(cpu_facts(allreduce=AllReduceRun(4, "nccl", 0, False, 120.0, lines)))
    assert c.status == "pass" and "summed to 10" in c.detail
    algbw = 4 * MIB / 0.002 / 1e9
    assert c.data["algbw_gbps"] == pytest.approx(algbw, abs=1e-3)
    assert c.data["busbw_gbps"] == pytest.approx(algbw * 1.5, abs=1e-3)  # 2(n-1)/n for n=4
    assert checks.bus_bandwidth(10.0, 2) == 10.0 and checks.bus_bandwidth(10.0, 1) == 0.0


def test_allreduce_results_found_when_two_ranks_share_a_line() -> None:
    joined = (worker_line(0, 2) + worker_line(1, 2), "")  # seen once: writes interleaved
    c = checks.allreduce(cpu_facts(allreduce=AllReduceRun(2, "gloo", 0, False, 120.0, joined)))
    assert c.status == "pass", c.detail


def test_allreduce_wrong_sum_fails() -> None:
    lines = (worker_line(0, 2), worker_line(1, 2, wrong=5))
    c = checks.allreduce(cpu_facts(allreduce=AllReduceRun(2, "gloo", 0, False, 120.0, lines)))
    assert c.status == "fail" and "wrong sums, want 3" in c.detail and "rank 1" in c.detail


def test_allreduce_failure_shows_the_workers_error() -> None:
    out = ("Traceback (most recent call last):",
           "RuntimeError: [enforce fail at device.cc:84] Unable to find address for: nosuch0",
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
           "  exitcode  : 1 (pid: 1867)", "=" * 60)
    c = checks.allreduce(cpu_facts(allreduce=AllReduceRun(2, "gloo", 1, False, 120.0, out)))
    assert c.status == "fail" and "exit code 1" in c.detail
    assert "Unable to find address for: nosuch0" in c.detail and "ChildFailedError" not in c.detail
    # one rank reported, the other never did
    half = AllReduceRun(2, "gloo", 0, False, 120.0, (worker_line(0, 2),))
    assert "no result from rank 1" in checks.allreduce(cpu_facts(allreduce=half)).detail


def test_allreduce_timeout_fails() -> None:
    hung = AllReduceRun(2, "nccl", None, True, 120.0, ("NCCL INFO Bootstrap : Using eth0",))
    c = checks.allreduce(cpu_facts(allreduce=hung))
    assert c.status == "fail" and "did not finish in 120 s" in c.detail and "nccl-env" in c.fix


# -- the whole node --------------------------------------------------------------------------------
def test_run_all_and_summary() -> None:
    results = checks.run_all(cpu_facts(nofile_soft=1024, shm=Shm("/dev/shm", 64 * MIB, 64 * MIB)))
    assert [c.name for c in results] == ["devices", "versions", "bf16", "topology", "nccl-env",
                                         "shm", "open-files", "disk", "all-reduce"]
    counts = checks.summary(results)
    assert counts == {"passed": 7, "warnings": 1, "failed": 1}
    assert checks.summary_line(counts) == "7 passed, 1 warning, 1 failed"
    assert all((c.fix == "") == (c.status == "pass") for c in results)
    json.dumps([c.to_dict() for c in results])  # JSON-safe


def test_default_target() -> None:
    cpu_only = Node("local", "127.0.0.1", cpu_devices(16))
    assert default_target(cpu_only) == Target("local", None, "cpu", "pcie", cpu_devices(2))
    gpus = Node("local", "127.0.0.1", gpu_devices(4) + cpu_devices(16), gpu_fabric="nvswitch")
    assert default_target(gpus) == Target("local", None, "H100-SXM", "nvswitch", gpu_devices(4))


def test_checks_module_does_not_import_torch() -> None:
    code = ("import sys, gpufleet.doctor.checks, gpufleet.doctor.command; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_render_shows_statuses_matrix_and_summary() -> None:
    import io

    from rich.console import Console

    from gpufleet.doctor.command import NodeReport, render

    facts = gpu_facts(network="nvlink", shm=Shm("/dev/shm", 64 * MIB, 64 * MIB))
    report = NodeReport("local", "llama", checks.run_all(facts))
    buf = io.StringIO()
    render([report], Console(file=buf, width=200))
    text = buf.getvalue()
    assert "Node local, cluster llama" in text
    assert "GPU topology" in text and "NV4" in text and "SYS" in text
    assert "--shm-size=16g" in text
    assert text.rstrip().splitlines()[-1] == "7 passed, 1 warning, 1 failed"
    assert report.to_dict()["checks"][3]["data"]["matrix"][0] == ["X", "NV4", "SYS", "SYS"]
