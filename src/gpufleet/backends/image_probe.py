"""One short run of the job's image, with the options a job gets, asking what is inside.

The image must bring a Python >= 3.11 and torch (gpufleet's worker side is mounted from the
node); its torch's CUDA must not be newer than the node's driver; /dev/shm inside must be big
enough. Only the image itself can say these, so one container runs a short snippet that prints
one JSON line. `probe_argv` and `parse_probe` are pure; `probe` is the edge.

A container that did not start (the runtime refused an option, no docker daemon) is told apart
from an image without the interpreter (the runtime's exit 127, "executable file not found") and
from a Python that ran but could not run the snippet (too old).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from gpufleet.backends.runtime import REASON_CHARS, Ran, Run, run_argv, short_reason
from gpufleet.errors import excerpt
from gpufleet.launch.container import Container, NodeSide

PROBE_TIMEOUT_S = 120.0  # starting the container and importing torch; seconds on a busy node
MARKER = "GPUFLEET_IMAGE_PROBE "  # an entrypoint may print a banner first (NGC's does)
STACK_BYTES = 64 * 2**20  # `--ulimit stack=67108864`, as NGC's PyTorch recipes set

# Plain enough for any Python 3 to parse (no f-strings, no walrus), so an old Python in the
# image still answers with its version instead of a SyntaxError.
SNIPPET = """\
import importlib.util, json, os, sys
out = {"python": sys.executable, "python_version": "%d.%d.%d" % tuple(sys.version_info[:3])}
try:
    import torch
    out["torch"] = str(torch.__version__)
    out["torch_cuda"] = torch.version.cuda
except ImportError as e:
    out["torch"] = None
    out["torch_error"] = str(e)[:200]
except Exception as e:
    out["torch"] = None
    out["torch_error"] = ("%s: %s" % (type(e).__name__, e))[:200]
try:
    s = os.statvfs("/dev/shm")
    out["shm_bytes"] = s.f_frsize * s.f_blocks
except OSError:
    out["shm_bytes"] = None
out["gpufleet"] = importlib.util.find_spec("gpufleet") is not None
print("%s%s" % (MARKER, json.dumps(out)))
sys.stdout.flush()
""".replace("MARKER", repr(MARKER))


@dataclass(frozen=True)
class Probed:
    """What the image said about itself."""

    python: str  # the interpreter's path inside, e.g. /usr/bin/python3
    python_version: str  # "3.11.2"
    torch: str | None  # "2.4.0+cu124"; None: torch does not import
    torch_cuda: str | None  # CUDA torch was built with, "12.4"; None for a CPU build
    shm_bytes: int | None  # size of /dev/shm inside
    gpufleet: bool  # the image has its own gpufleet (informational: the node's is mounted)
    torch_error: str | None = None  # why torch did not import


@dataclass(frozen=True)
class ProbeFailed:
    """The probe gave no answer. `start`: the container did not start (the reason is the
    runtime's own line); `python`: it started but has no such interpreter, or it could not
    run the snippet."""

    kind: Literal["start", "python"]
    reason: str


def probe_name(node_name: str) -> str:
    """A name of its own per probe, so a probe past its time can be removed by name."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in node_name)[:40]
    return f"gpufleet-probe-{safe}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def probe_argv(c: Container, node: NodeSide, name: str) -> list[str]:
    """The probe's `run` with the options a job's container gets (host network, pid and uts,
    host IPC or the asked shm size, the memlock and stack limits, the job's extra options).

    The lead's `launch/container.wrap` builds the job's own argv; when it lands, this should
    become a call to it, so the probe cannot drift from what the job gets."""
    memlock = "-1" if node.memlock < 0 else str(node.memlock)
    ipc = ["--shm-size", c.shm_size] if c.shm_size else ["--ipc", "host"]
    return [node.runtime, "run", "--rm", "--name", name, "--pull", "never",
            "--network", "host", "--pid", "host", "--uts", "host", *ipc,
            "--ulimit", f"memlock={memlock}:{memlock}",
            "--ulimit", f"stack={STACK_BYTES}:{STACK_BYTES}",
            *(["--user", f"{node.uid_gid[0]}:{node.uid_gid[1]}"] if node.uid_gid else []),
            *c.opts, c.image, node.python, "-c", SNIPPET]


def _str(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    return value if isinstance(value, str) else None


def parse_probe(returncode: int | None, stdout: str, stderr: str,
                timeout_s: float = PROBE_TIMEOUT_S, python: str = "python3") -> Probed | ProbeFailed:
    """The probe's answer from what the `run` did (pure)."""
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            try:
                doc = json.loads(line[len(MARKER):])
            except ValueError:
                break
            shm = doc.get("shm_bytes")
            return Probed(str(doc.get("python", python)), str(doc.get("python_version", "?")),
                          _str(doc, "torch"), _str(doc, "torch_cuda"),
                          shm if isinstance(shm, int) else None, doc.get("gpufleet") is True,
                          _str(doc, "torch_error"))
    ran = Ran(returncode, stdout, stderr)
    reason = short_reason(ran, timeout_s)
    text = stderr.lower()
    if returncode == 127 and ("not found" in text or "no such file" in text):
        return ProbeFailed("python", f"{python} is not in the image ({reason})")
    if returncode in (None, 125, 126, 127):
        return ProbeFailed("start", reason)
    last = [ln for ln in (stderr + "\n" + stdout).splitlines() if ln.strip()]
    said = excerpt(last[-1].strip(), REASON_CHARS) if last else f"exit code {returncode}"
    return ProbeFailed("python", f"{python} could not run the probe: {said}")


def probe(c: Container, node: NodeSide, node_name: str, run: Run = run_argv,
          timeout_s: float = PROBE_TIMEOUT_S) -> Probed | ProbeFailed:
    """Run the probe; past its time the container is removed by name (a killed `podman run`
    leaves its container running)."""
    name = probe_name(node_name)
    ran = run(probe_argv(c, node, name), timeout_s)
    if ran.returncode is None:
        run([node.runtime, "rm", "-f", name], 30.0)
    return parse_probe(ran.returncode, ran.stdout, ran.stderr, timeout_s, node.python)
