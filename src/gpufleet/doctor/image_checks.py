"""Is a job's image usable on a node: pure checks from what the node found to findings.

The facts (`ImageFacts`) come from `backends/image_preflight.py` (the runtime, the image, one
probe run of it); here they are judged, so every verdict (no torch, a CUDA newer than the driver,
a 64 MiB /dev/shm) is tested with hand-made facts. Each failing check is ONE line with its fix
(`failure_line`), the line a run stops on before any worker starts, and the row `doctor --image`
shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufleet.backends.image_probe import Probed, ProbeFailed
from gpufleet.doctor.model import GIB, MIB, Check

MIN_PYTHON = (3, 11)  # gpufleet's worker side (bootstrap, gpufleet.train) is mounted, not copied
SHM_MIN_BYTES = 1 * GIB  # DataLoader batches and NCCL's shared-memory transport pass through it
EXAMPLE_IMAGE = "nvcr.io/nvidia/pytorch:24.06-py3"
RUNTIME_FIX = ("install podman (or docker) on the node, or set GPUFLEET_CONTAINER_RUNTIME to "
               "podman, docker or its path")


@dataclass(frozen=True)
class ImageFacts:
    """What one node found about one image. A later fact is None when an earlier one failed
    (no runtime: nothing was asked about the image)."""

    image: str
    node: str
    runtime: str | None  # the runtime's path
    runtime_version: str | None  # "podman 4.3.1"
    runtime_error: str | None  # why there is no working runtime
    image_error: str | None  # why the image is not on the node (the runtime's reason)
    pulled: bool  # pulled for this check
    probe: Probed | ProbeFailed | None
    driver_cuda: str | None  # newest CUDA the node's driver supports; None: no NVIDIA driver
    memlock: int  # what a container gets: -1 unlimited, else bytes
    shm_size: str | None  # the job's --shm-size; None: host IPC


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def runtime_check(f: ImageFacts) -> Check:
    if f.runtime_error is not None:
        return Check("runtime", "fail", f.runtime_error, RUNTIME_FIX if f.runtime is None else
                     "start the runtime's service (docker: its daemon), or choose another with "
                     "GPUFLEET_CONTAINER_RUNTIME=podman|docker|PATH")
    if isinstance(f.probe, ProbeFailed) and f.probe.kind == "start":
        return Check("runtime", "fail", f"{f.runtime_version} could not start a container: "
                     f"{f.probe.reason}", "run the same `run` by hand on the node to see why; "
                     "the runtime's configuration (runtime, ulimits, cgroups) must allow it")
    return Check("runtime", "pass", f"{f.runtime_version} ({f.runtime})")


def image_check(f: ImageFacts) -> Check | None:
    if f.runtime_error is not None:
        return None
    if f.image_error is not None:
        return Check("image", "fail", f"image {f.image} is not on {f.node} and could not be "
                     f"pulled: {f.image_error}", f"`{_flavor(f)} load -i FILE` on {f.node}, or "
                     "make a registry that has it reachable from the node")
    return Check("image", "pass", f"{f.image} " + ("pulled" if f.pulled else "present"))


def _flavor(f: ImageFacts) -> str:
    return (f.runtime_version or "podman").split()[0]


def python_check(f: ImageFacts) -> Check | None:
    p = f.probe
    if isinstance(p, ProbeFailed) and p.kind == "python":
        return Check("python", "fail", p.reason, "choose an image with Python >= 3.11 and torch, "
                     f"such as {EXAMPLE_IMAGE}")
    if not isinstance(p, Probed):
        return None
    if _version(p.python_version) < MIN_PYTHON:
        return Check("python", "fail", f"Python {p.python_version} ({p.python}) is older than "
                     "3.11, which gpufleet's worker side needs", "choose an image with Python "
                     f">= 3.11, such as {EXAMPLE_IMAGE}")
    return Check("python", "pass", f"Python {p.python_version} ({p.python})")


def torch_check(f: ImageFacts) -> Check | None:
    p = f.probe
    if not isinstance(p, Probed):
        return None
    if p.torch is None:
        said = p.torch_error or ""
        what = ("torch is not installed" if not said or said.startswith("No module named")
                else f"torch does not import ({said})")
        return Check("torch", "fail", what, f"install torch in the image, or choose an image "
                     f"such as {EXAMPLE_IMAGE}")
    build = f"CUDA {p.torch_cuda}" if p.torch_cuda else "a CPU build"
    return Check("torch", "pass", f"torch {p.torch} ({build})")


def cuda_check(f: ImageFacts) -> Check | None:
    """The image's CUDA (torch's build) against the newest CUDA the node's driver supports,
    by major.minor: a newer one fails at the first CUDA call in every worker."""
    p = f.probe
    if not isinstance(p, Probed) or p.torch is None:
        return None
    if p.torch_cuda is None:
        return Check("cuda", "pass", "torch is a CPU build: no CUDA to match")
    if f.driver_cuda is None:
        return Check("cuda", "pass", f"image CUDA {p.torch_cuda}; no NVIDIA driver on {f.node} "
                     "to compare with")
    if _version(p.torch_cuda) > _version(f.driver_cuda):
        return Check("cuda", "fail", f"the image's CUDA {p.torch_cuda} (torch {p.torch}) is "
                     f"newer than {f.node}'s driver supports ({f.driver_cuda})",
                     f"choose an image built for CUDA <= {f.driver_cuda}, or update the NVIDIA "
                     f"driver on {f.node}")
    return Check("cuda", "pass", f"image CUDA {p.torch_cuda} <= driver's {f.driver_cuda}")


def shm_check(f: ImageFacts) -> Check | None:
    p = f.probe
    if not isinstance(p, Probed):
        return None
    where = f"--shm-size {f.shm_size}" if f.shm_size else "the host's, with --ipc host"
    if p.shm_bytes is None:
        return Check("shm", "fail", f"no /dev/shm inside ({where})",
                     "run with --shm-size 8g (or larger)")
    if p.shm_bytes < SHM_MIN_BYTES:
        fix = ("run with a larger --shm-size, e.g. --shm-size 8g" if f.shm_size else
               f"run with --shm-size 8g (private IPC of that size), or enlarge /dev/shm on {f.node}")
        return Check("shm", "fail", f"/dev/shm inside is {_gib(p.shm_bytes)} ({where}); DataLoader "
                     f"workers and NCCL need at least {_gib(SHM_MIN_BYTES)}", fix)
    return Check("shm", "pass", f"/dev/shm inside is {_gib(p.shm_bytes)} ({where})")


def memlock_check(f: ImageFacts) -> Check | None:
    """Informational: NCCL over InfiniBand pins memory; a limited memlock is said, not failed
    (gloo and NCCL over sockets do not need it)."""
    if f.runtime_error is not None:
        return None
    if f.memlock < 0:
        return Check("memlock", "pass", "containers get --ulimit memlock=-1 (unlimited)")
    return Check("memlock", "warn", f"{f.node} cannot raise the locked-memory limit: containers "
                 f"get memlock={_gib(f.memlock)} (enough for gloo and NCCL over sockets)",
                 "for InfiniBand/RDMA raise the hard memlock limit on the node "
                 "(limits.conf, or the service's LimitMEMLOCK=infinity)")


def gpufleet_check(f: ImageFacts) -> Check | None:
    """The node's gpufleet, mounted read-only, must import in the image's Python: the bootstrap
    and the worker's reports run from it."""
    p = f.probe
    if not isinstance(p, Probed):
        return None
    if p.gpufleet_mounted is not None:
        return Check("gpufleet", "fail", f"gpufleet, mounted from {f.node}, does not import in "
                     f"the image's Python ({p.gpufleet_mounted})", "choose an image with "
                     f"Python >= 3.11, such as {EXAMPLE_IMAGE}")
    own = " (the image also has its own, unused)" if p.gpufleet else ""
    return Check("gpufleet", "pass", f"gpufleet, mounted read-only from {f.node}, imports{own}")


def run_all(f: ImageFacts) -> list[Check]:
    found = [runtime_check(f), image_check(f), python_check(f), torch_check(f), cuda_check(f),
             shm_check(f), memlock_check(f), gpufleet_check(f)]
    return [c for c in found if c is not None]


def failure_line(f: ImageFacts, c: Check) -> str:
    """One failing check as the one line a run stops on: what, on which node, and the fix."""
    if c.name == "image":  # its detail already names the image and the node
        return f"{c.detail} (fix: {c.fix})"
    if c.name == "runtime":
        return f"image {f.image} on {f.node}: {c.detail} (fix: {c.fix})"
    return f"image {f.image} on {f.node}: {c.detail} ({c.fix})"
