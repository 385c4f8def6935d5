"""Environment presets: device pinning, thread counts and NCCL settings from the topology.

Values here are defaults: anything the user sets (in their shell or the job's `env`) wins.
"""

from __future__ import annotations

from gpufleet.pool.model import Placement

# NCCL settings per fabric (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
NCCL_BY_FABRIC: dict[str, dict[str, str]] = {
    "pcie": {"NCCL_IB_DISABLE": "1"},
    "nvlink": {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"},
    "nvswitch": {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"},
    "infiniband": {"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "^lo,docker"},
    "ethernet": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^lo,docker"},
}


def device_env(placement: Placement, fabric: str, host_cpus: int,
               workers: int | None = None) -> dict[str, str]:
    """Pin the node's devices and pick the process-group backend: nccl on GPUs, gloo on CPU
    (and on simulated GPUs, which run as CPU workers).

    Threads per worker split the host's cores over the workers that will run (`workers`, by
    default one per device), so they do not oversubscribe the CPU.
    """
    workers = workers or len(placement.devices)
    threads = str(max(1, host_cpus // max(1, workers)))
    on_cpu = all(d.gpu == "cpu" or d.simulated for d in placement.devices)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if on_cpu:
        # hide any GPUs from CPU workers so a CPU cluster never touches a device it did not reserve
        env.update({"CUDA_VISIBLE_DEVICES": "", "GPUFLEET_DEVICE": "cpu", "GPUFLEET_BACKEND": "gloo"})
    else:
        env.update({
            "CUDA_VISIBLE_DEVICES": ",".join(str(d.index) for d in placement.devices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # NVML's order, so the indices mean the same GPUs
            "GPUFLEET_DEVICE": "cuda",
            "GPUFLEET_BACKEND": "nccl",
            **NCCL_BY_FABRIC.get(fabric, {}),
        })
    return env
