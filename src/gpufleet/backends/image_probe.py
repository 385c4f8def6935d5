"""One short run of the job's image, with the options a job gets, asking what is inside.

The image must bring a Python >= 3.11 and torch (gpufleet's worker side is mounted from the
node); its torch's CUDA must not be newer than the node's driver; /dev/shm inside must be big
enough. Only the image itself can say these, so one container runs a short snippet that prints
one JSON line. `probe_wrapped` (the job's own container argv, `launch.container.wrap`) and
`parse_probe` are pure; `probe` is the edge.

A container that did not start (the runtime refused an option, no docker daemon) is told apart
from an image without the interpreter (the runtime's exit 127, "executable file not found") and
from a Python that ran but could not run the snippet (too old).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpufleet.backends.runtime import REASON_CHARS, Ran, Run, run_argv, short_reason
from gpufleet.errors import excerpt
from gpufleet.launch.container import Container, NodeSide, Wrapped, wrap

PROBE_TIMEOUT_S = 120.0  # starting the container and importing torch; seconds on a busy node
MARKER = "GPUFLEET_IMAGE_PROBE "  # an entrypoint may print a banner first (NGC's does)

# Plain enough for any Python 3 to parse (no f-strings, no walrus), so an old Python in the
# image still answers with its version instead of a SyntaxError.
SNIPPET = """\
import json, os, sys
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
given = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
out["gpufleet"] = any(os.path.isdir(os.path.join(p, "gpufleet")) for p in sys.path
                      if p and p not in given)
try:
    import gpufleet.telemetry.wire
    out["gpufleet_mounted"] = None
except Exception as e:
    out["gpufleet_mounted"] = ("%s: %s" % (type(e).__name__, e))[:200]
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
    gpufleet_mounted: str | None = None  # why the node's mounted gpufleet did not import


@dataclass(frozen=True)
class ProbeFailed:
    """The probe gave no answer. `start`: the container did not start (the reason is the
    runtime's own line); `python`: it started but has no such interpreter, or it could not
    run the snippet."""

    kind: Literal["start", "python"]
    reason: str


def probe_run() -> str:
    """The probe's run id in its container's name (`gpufleet-JOB-NODE-probe-...`): its own per
    probe, so one past its time is removed by name."""
    return f"probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def probe_wrapped(c: Container, node: NodeSide, node_name: str, env: Mapping[str, str],
                  workdir: str, package_dir: str) -> Wrapped:
    """The probe as the job's own container (`launch.container.wrap`: host network, pid, uts,
    IPC or the shm size, memlock and stack, the job's options, gpufleet's package mounted
    read-only), running the snippet instead of the launcher. The image is already there (or
    refused) by now: the probe never pulls."""
    return wrap(replace(c, pull="never"), node, [node.python, "-c", SNIPPET], env, workdir,
                package_dir, node_name, probe_run())


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
                          _str(doc, "torch_error"), _str(doc, "gpufleet_mounted"))
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
          env: Mapping[str, str] | None = None,
          timeout_s: float = PROBE_TIMEOUT_S) -> Probed | ProbeFailed:
    """Run the probe in an empty workdir of its own; past its time the container is removed by
    name (a killed `podman run` leaves its container running)."""
    import gpufleet

    package_dir = os.path.dirname(os.path.abspath(gpufleet.__file__))
    with tempfile.TemporaryDirectory(prefix="gpufleet-probe-") as workdir:
        w = probe_wrapped(c, node, node_name, dict(os.environ if env is None else env), workdir,
                          package_dir)
        ran = run(w.argv, timeout_s, w.env)
        if ran.returncode is None:
            run(w.cleanup, 30.0, w.env)
    return parse_probe(ran.returncode, ran.stdout, ran.stderr, timeout_s, node.python)
