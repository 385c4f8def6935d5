"""The container runtime on this node, and what the node can give a container.

Everything here runs on the node that will hold a job's container (this host for the local
pool, the node agent's host elsewhere), before any worker starts. Each fact that needs another
program goes through one seam, `Run`: a plain function from an argv and a time limit to what the
program did (`Ran`). `run_argv` is the real one; a test passes its own function, so the parsing
and the pull policy are tested without podman, and the integration tests run the real podman.

    runtime_facts  podman, then docker, on PATH (or GPUFLEET_CONTAINER_RUNTIME), and its version
    ensure_image   the image present, pulled per the job's `--pull` policy, or why not
    memlock_limit  -1 when a container may lock unlimited memory here, else the hard limit
    driver_cuda    the newest CUDA the node's NVIDIA driver supports ("12.4"), None without one
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpufleet.errors import excerpt
from gpufleet.launch.container import Flavor

RUNTIME_ENV = "GPUFLEET_CONTAINER_RUNTIME"  # podman | docker | a path to either
DEFAULT_RUNTIMES = ("podman", "docker")  # podman first: daemonless, rootless, CDI devices
VERSION_TIMEOUT_S = 30.0
INSPECT_TIMEOUT_S = 60.0  # `image exists` reads the local store; a busy store can be slow
PULL_TIMEOUT_S = 900.0  # an NGC PyTorch image is ~10 GB: minutes on an ordinary link
REASON_CHARS = 200  # the most of a runtime's own error text one line repeats


@dataclass(frozen=True)
class Ran:
    """What a program did: its exit code (None: killed at the time limit) and its output."""

    returncode: int | None
    stdout: str
    stderr: str


class Run(Protocol):
    """Run `argv` for at most `timeout_s` seconds, in `env` (None: this process's environment)."""

    def __call__(self, argv: Sequence[str], timeout_s: float,
                 env: Mapping[str, str] | None = None) -> Ran: ...


def run_argv(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
    """The real `Run`: the program with no stdin, its output captured, killed at `timeout_s`."""
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=timeout_s, check=False,
                              env=None if env is None else dict(env))
    except subprocess.TimeoutExpired as exc:
        def text(b: bytes | str | None) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        return Ran(None, text(exc.stdout), text(exc.stderr))
    except OSError as exc:  # not there, not executable: as a shell says it
        return Ran(127 if isinstance(exc, FileNotFoundError) else 126, "", str(exc))
    return Ran(done.returncode, done.stdout, done.stderr)


def short_reason(ran: Ran, timeout_s: float) -> str:
    """The runtime's own reason for a failure, on one short line: its last `Error:` line (podman
    and docker both print one), else its last line of output."""
    if ran.returncode is None:
        return f"no answer in {timeout_s:.0f} s"
    lines = [ln.strip() for ln in (ran.stderr + "\n" + ran.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("error")]
    line = (errors or lines or [f"exit code {ran.returncode}"])[-1]
    line = re.sub(r"^error(response from daemon)?:\s*", "", line, flags=re.IGNORECASE)
    return excerpt(line, REASON_CHARS)


# -- the runtime ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RuntimeFacts:
    """The runtime this node would use. `error` says why none works (then `path` may be None)."""

    path: str | None
    flavor: Flavor | None
    version: str | None
    error: str | None = None


def parse_version(text: str) -> tuple[Flavor, str] | None:
    """("podman", "4.3.1") from `podman version 4.3.1`; ("docker", "24.0.7") from
    `Docker version 24.0.7, build afdd53b`; None for anything else."""
    m = re.search(r"\b(podman|docker) version v?([0-9][\w.+~-]*)", text, re.IGNORECASE)
    if m is None:
        return None
    flavor: Flavor = "docker" if m.group(1).lower() == "docker" else "podman"
    return flavor, m.group(2).rstrip(",")


def runtime_facts(run: Run, environ: Mapping[str, str],
                  which: Callable[[str], str | None] = shutil.which) -> RuntimeFacts:
    """The first runtime found (GPUFLEET_CONTAINER_RUNTIME, else podman, then docker) and its
    version. A runtime whose `--version` fails or says something else is an error, not a guess."""
    asked = environ.get(RUNTIME_ENV, "").strip()
    names = (asked,) if asked else DEFAULT_RUNTIMES
    path = next((p for p in (which(n) for n in names) if p), None)
    if path is None:
        if asked:
            return RuntimeFacts(None, None, None, f"{RUNTIME_ENV}={excerpt(asked)} is not an "
                                "executable (give podman, docker or a path to either)")
        return RuntimeFacts(None, None, None, "no container runtime: neither podman nor docker "
                            "is on PATH")
    ran = run([path, "--version"], VERSION_TIMEOUT_S)
    found = parse_version(ran.stdout + ran.stderr) if ran.returncode == 0 else None
    if found is None:
        return RuntimeFacts(path, None, None, f"{path} --version failed: "
                            f"{short_reason(ran, VERSION_TIMEOUT_S)}")
    return RuntimeFacts(path, found[0], found[1])


# -- the image ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageState:
    """Whether the image is on the node now; `pulled` when this call fetched it; `error` the
    runtime's reason when it is not there and could not be pulled; `runtime_error` when the
    runtime could not be asked at all."""

    present: bool
    pulled: bool = False
    error: str | None = None
    runtime_error: str | None = None  # the runtime could not even say (no docker daemon)


def image_present(run: Run, runtime: str, flavor: Flavor, image: str) -> bool | str:
    """True/False, or the runtime's reason when it could not tell (a docker daemon not running)."""
    if flavor == "podman":  # exit 0: present, 1: absent
        ran = run([runtime, "image", "exists", image], INSPECT_TIMEOUT_S)
        if ran.returncode in (0, 1):
            return ran.returncode == 0
    else:  # docker has no `image exists`; inspect says "No such image" for an absent one
        ran = run([runtime, "image", "inspect", "--format", "{{.Id}}", image], INSPECT_TIMEOUT_S)
        if ran.returncode == 0:
            return True
        if "no such image" in (ran.stderr + ran.stdout).lower():
            return False
    return short_reason(ran, INSPECT_TIMEOUT_S)


def pull_decision(policy: str, present: bool) -> Literal["use", "pull", "refuse"]:
    """What `--pull never|missing|always` does with an image that is (or is not) here."""
    if policy == "always" or (policy == "missing" and not present):
        return "pull"
    return "use" if present else "refuse"


def ensure_image(run: Run, runtime: str, flavor: Flavor, image: str, policy: str,
                 pull_timeout_s: float = PULL_TIMEOUT_S) -> ImageState:
    """The image on the node per the pull policy; a pull is bounded by `pull_timeout_s`."""
    present = image_present(run, runtime, flavor, image)
    if isinstance(present, str):
        return ImageState(False, runtime_error=present)
    decision = pull_decision(policy, present)
    if decision == "use":
        return ImageState(True)
    if decision == "refuse":
        return ImageState(False, error="--pull never, and it is not there")
    ran = run([runtime, "pull", "--quiet" if flavor == "podman" else "-q", image],
              pull_timeout_s)
    if ran.returncode == 0:
        return ImageState(True, pulled=True)
    return ImageState(False, error=short_reason(ran, pull_timeout_s))


# -- what the node gives a container ---------------------------------------------------------------
# Run in a throwaway child: raising a limit there changes nothing in this process.
RAISE_MEMLOCK = ("import resource as r; "
                 "r.setrlimit(r.RLIMIT_MEMLOCK, (r.RLIM_INFINITY, r.RLIM_INFINITY))")


def memlock_limit(run: Run = run_argv) -> int:
    """-1 when a container started from here may lock unlimited memory (the hard limit is
    unlimited, or a child may raise it: root with CAP_SYS_RESOURCE), else the hard limit in bytes.

    NCCL and InfiniBand pin buffers, which is why NGC recipes ask `--ulimit memlock=-1`; a
    runtime asked for more than the node allows refuses to start the container ("error setting
    rlimit ... operation not permitted"), so the job gets what the node can give. For docker the
    daemon sets the limit, not this process: this is the best the caller can know."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard == resource.RLIM_INFINITY:
        return -1
    ran = run([sys.executable, "-c", RAISE_MEMLOCK], VERSION_TIMEOUT_S)
    return -1 if ran.returncode == 0 else hard


# podman's configuration files, in the order it reads them (a later one wins); CONTAINERS_CONF,
# when set, is the only one (containers.conf(5))
PODMAN_CONFS = ("/usr/share/containers/containers.conf", "/etc/containers/containers.conf")


def configured_ulimits(flavor: Flavor, environ: Mapping[str, str],
                       read: Callable[[str], str | None]) -> tuple[str, ...]:
    """The default ulimits podman's containers.conf gives every container, other than the two
    gpufleet sets (memlock, stack). podman 4 drops ALL of them as soon as a command line has
    one `--ulimit`, so a job's container would start without the node's nofile and nproc
    defaults (a node whose runtime refuses its built-in ones then cannot start any); gpufleet
    passes them again. docker's daemon merges its own defaults with a container's: nothing to
    do there. `read`: a file's text, None when there is none."""
    if flavor != "podman":
        return ()
    if environ.get("CONTAINERS_CONF"):
        paths: list[str] = [environ["CONTAINERS_CONF"]]
    else:
        home = environ.get("XDG_CONFIG_HOME") or (environ.get("HOME", "") + "/.config")
        paths = [*PODMAN_CONFS, f"{home}/containers/containers.conf"]
    found: list[str] = []
    for path in paths:
        text = read(path)
        if text is None:
            continue
        try:
            conf = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue  # podman itself says what is wrong with it
        limits = conf.get("containers", {}).get("default_ulimits")
        if isinstance(limits, list):
            found = [str(x) for x in limits]
    return tuple(x for x in found if x.partition("=")[0] not in ("memlock", "stack"))


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def parse_smi_cuda(header: str) -> str | None:
    """"12.4" from nvidia-smi's header line `... CUDA Version: 12.4 |`."""
    m = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", header)
    return m.group(1) if m else None


def nvml_cuda(nvml: Any = None) -> str | None:
    """NVML's `nvmlSystemGetCudaDriverVersion` as "12.4"; None without pynvml or a driver.
    `nvml` is the pynvml module or a stand-in with the same functions."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no driver here
        return None
    try:
        raw = int(nvml.nvmlSystemGetCudaDriverVersion())  # 12040 for CUDA 12.4
        return f"{raw // 1000}.{raw % 1000 // 10}"
    except Exception:
        return None
    finally:
        nvml.nvmlShutdown()


def driver_cuda(run: Run = run_argv, which: Callable[[str], str | None] = shutil.which,
                nvml: Any = None) -> str | None:
    """The newest CUDA the node's driver supports: NVML, else nvidia-smi's header; None on a
    node without an NVIDIA driver."""
    found = nvml_cuda(nvml)
    if found is not None:
        return found
    smi = which("nvidia-smi")
    if smi is None:
        return None
    ran = run([smi], VERSION_TIMEOUT_S)
    return parse_smi_cuda(ran.stdout) if ran.returncode == 0 else None
