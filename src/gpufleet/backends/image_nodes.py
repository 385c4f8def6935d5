"""A job's image checked on the nodes a pool granted, before the job exists (SSH pools).

The local pool checks the image on this host before anything is reserved
(`lifecycle.submit.check_environment`). A pool whose nodes are other machines cannot be asked
before it grants them, but it can be asked right after, before the job is created: an engine
with `ChecksImages` runs each granted node's own preflight (backends/image_preflight.py, the
same checks its agent repeats at start) and a failure is one line naming the image and the
node, exit 2, the cluster made for the job stopped again. Without this a missing image was a
job that failed at start. Engines without it (Ray, Slurm: a node is reached only through a task
or a step inside the allocation) check on each node as the run starts (backends/node_image.py).

`python -m gpufleet.backends.image_nodes CONTAINER_JSON NODE` is the node's side: exit 0 with
the preflight's notes (a pull, a warning), or IMAGE_FAILED_EXIT with the failure line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from gpufleet.backends.image_preflight import preflight
from gpufleet.backends.node_image import IMAGE_FAILED_EXIT
from gpufleet.errors import ImageError
from gpufleet.launch.container import Container


@runtime_checkable
class ChecksImages(Protocol):
    """An engine that can run the image's preflight on some of its nodes now."""

    def check_image(self, node_ids: Sequence[str], container: Mapping[str, Any],
                    ref: str = "") -> dict[str, str]:
        """For each of `node_ids`: "" when the image passed every check there, else the one
        line that says what failed (an unreachable node says so). All nodes at once; a pull is
        waited for (runtime.PULL_TIMEOUT_S)."""
        ...


def failures(engine: object, node_ids: Sequence[str], container: Mapping[str, Any],
             ref: str = "", say: Callable[[str], None] | None = None) -> list[str] | None:
    """The nodes' failure lines (empty: all passed); None when the engine cannot be asked
    (its nodes check as the run starts)."""
    if not isinstance(engine, ChecksImages) or not node_ids:
        return None
    image = Container.from_json(container).image
    if say is not None:
        say(f"checking image {image} on {len(node_ids)} node(s) "
            f"(a pull, where needed, is waited for)")
    answers = engine.check_image(node_ids, container, ref)
    return [answers.get(n, f"image {image}: node {n} did not answer its check")
            for n in node_ids if answers.get(n, "x")]


def node_answer(code: int | None, stdout: str, stderr: str, image: str, node: str) -> str:
    """A node's check, as `check_image` reports it (pure): "" for exit 0, the failure line for
    IMAGE_FAILED_EXIT, else why the node could not be asked (no answer, no gpufleet there)."""
    if code == 0:
        return ""
    if code == IMAGE_FAILED_EXIT:
        lines = [ln for ln in stdout.splitlines() if ln.strip()]
        return lines[-1] if lines else f"image {image} failed its check on {node}"
    if code is None:
        return f"image {image} could not be checked on {node}: no answer in time"
    last = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), f"exit {code}")
    return f"image {image} could not be checked on {node}: {last.strip()}"


def main(argv: Sequence[str]) -> int:
    """The node's side: the preflight of the image described by `argv[0]` on node `argv[1]`."""
    if len(argv) != 2:
        print("usage: python -m gpufleet.backends.image_nodes CONTAINER_JSON NODE",
              file=sys.stderr)
        return 2
    container = Container.from_json(json.loads(argv[0]))
    try:
        preflight(container, argv[1], print)
    except ImageError as exc:
        print(str(exc))
        return IMAGE_FAILED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
