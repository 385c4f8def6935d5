"""A job's image, checked on its node before any worker starts (and by `doctor --image`).

`gather` asks the node (runtime, image per the pull policy, memlock, the driver's CUDA, one
probe run of the image); `doctor.image_checks` judges; `preflight` turns the failures into one
`ImageError` and, when all pass, returns the `NodeSide` the container's argv is built from.
Called by `LocalBackend.start` and `NodeAgent.start` before they wrap the launcher, and for the
local pool at submission, before anything is reserved, so a bad image is exit 2 with nothing
held. Every side effect goes through `Run` (backends/runtime.py): tests pass a function.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gpufleet.backends import runtime
from gpufleet.backends.image_probe import PROBE_TIMEOUT_S, Probed, probe
from gpufleet.backends.runtime import Run, run_argv
from gpufleet.doctor.image_checks import ImageFacts, failure_line, run_all
from gpufleet.doctor.model import Check
from gpufleet.errors import ImageError
from gpufleet.launch.container import Container, NodeSide


@dataclass(frozen=True)
class Node:
    """The seams of one node: how programs run there, its environment, how PATH is searched,
    and its driver's CUDA (a function: NVML or nvidia-smi, asked only when the probe ran)."""

    run: Run = run_argv
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    which: Callable[[str], str | None] = shutil.which
    cuda: Callable[[], str | None] | None = None
    memlock: Callable[[], int] | None = None
    read: Callable[[str], str | None] = runtime.read_text  # a configuration file's text
    pull_timeout_s: float = runtime.PULL_TIMEOUT_S
    probe_timeout_s: float = PROBE_TIMEOUT_S


@dataclass(frozen=True)
class Gathered:
    facts: ImageFacts
    side: NodeSide | None  # None when there is no working runtime


def gather(c: Container, node_name: str, node: Node | None = None) -> Gathered:
    """Everything the checks need, asked in order; a step that fails leaves the later facts
    None (no runtime: nothing asked about the image; no image: no probe)."""
    n = node or Node()
    rt = runtime.runtime_facts(n.run, n.environ, n.which)
    memlock = (n.memlock or (lambda: runtime.memlock_limit(n.run)))()

    base = ImageFacts(image=c.image, node=node_name, runtime=rt.path,
                      runtime_version=f"{rt.flavor} {rt.version}" if rt.flavor else None,
                      runtime_error=rt.error, image_error=None, pulled=False, probe=None,
                      driver_cuda=None, memlock=memlock, shm_size=c.shm_size)
    if rt.error is not None or rt.path is None or rt.flavor is None:
        return Gathered(base, None)
    state = runtime.ensure_image(n.run, rt.path, rt.flavor, c.image, c.pull, n.pull_timeout_s)
    side = NodeSide(runtime=rt.path, flavor=rt.flavor, memlock=memlock,
                    ulimits=runtime.configured_ulimits(rt.flavor, n.environ, n.read))
    if state.runtime_error is not None:
        return Gathered(replace(base, runtime_error=f"{rt.flavor} {rt.version} ({rt.path}) does "
                                f"not answer: {state.runtime_error}"), None)
    if state.error is not None:
        return Gathered(replace(base, image_error=state.error), side)
    found = probe(c, side, node_name, n.run, n.environ, n.probe_timeout_s)
    cuda = (n.cuda or (lambda: runtime.driver_cuda(n.run, n.which)))()
    if isinstance(found, Probed):  # the image's own interpreter, by its path inside
        side = replace(side, python=found.python)
    return Gathered(replace(base, pulled=state.pulled, probe=found, driver_cuda=cuda), side)


def checks(c: Container, node_name: str, node: Node | None = None) -> tuple[ImageFacts,
                                                                              list[Check]]:
    """`doctor --image`'s rows for this node."""
    got = gather(c, node_name, node)
    return got.facts, run_all(got.facts)


def preflight(c: Container, node_name: str, say: Callable[[str], None],
              node: Node | None = None) -> NodeSide:
    """The `NodeSide` to build the job's container from, once the image passed every check on
    this node; else `ImageError` with one line per failure. Warnings (a limited memlock) and a
    pull are told through `say`."""
    got = gather(c, node_name, node)
    found = run_all(got.facts)
    failed = [failure_line(got.facts, x) for x in found if x.status == "fail"]
    if failed or got.side is None:
        raise ImageError("; ".join(failed) or f"image {c.image} on {node_name}: no runtime")
    if got.facts.pulled:
        say(f"image {c.image} pulled on {node_name}")
    for w in (x for x in found if x.status == "warn"):
        say(f"image {c.image} on {node_name}: {w.detail}")
    return got.side
