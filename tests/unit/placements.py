"""Placements and a job context for the command-building tests (test_launch, test_frameworks)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.launch.torchrun import JobContext
from gpufleet.pool.model import Device, Placement

JOB_DIR = Path("/state/jobs/train-ab12")
PY = "/venv/bin/python"


def cpu_placement(n: int) -> Placement:
    return Placement("local", "127.0.0.1",
                     tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=0) for i in range(n)))


def gpu_placement(indices: list[int], gpu: str = "H100-SXM") -> Placement:
    return Placement("local", "127.0.0.1", tuple(
        Device(id=f"gpu{i}", index=i, gpu=gpu, memory_bytes=80 * 2**30) for i in indices))


def ctx(fabric: str = "pcie", host_cpus: int = 16) -> JobContext:
    return JobContext(job_name="train-ab12", cluster_name="llama", job_dir=JOB_DIR,
                      report_addr="127.0.0.1:5555", fabric=fabric, python=PY, host_cpus=host_cpus)
