"""A node's launcher inside a container image: the runtime's command line, as data (pure).

Why the launcher (torchrun, or a framework's launcher) and not the whole node agent goes into
the container: the agent, the keeper under it, device telemetry and signed reports stay on the
host and own the container's life, so a stop, a killed supervisor or a lost link end the
container the way they end a bare launcher (the keeper removes it by name afterwards: a killed
`podman run` or `docker run` client does not stop its container).

What a distributed job needs is set by gpufleet, always, and the same options given again
through `container_opts` are refused before anything starts (`opt_problems`):

- the host's network, PID and UTS namespaces: rendezvous, NCCL and gloo reach peers by the
  node's address; the pids the workers report are the host's (the supervisor looks at them);
  and no container has a hostname of its own that torchrun would advertise and nobody resolve.
  The host's PID namespace is also what lets two containers on one host meet in torchrun's c10d
  rendezvous: it names each node agent `<local address or FQDN>_<pid>_<n>`, and two containers
  on one host share the address, and with private PID namespaces both torchruns are pid 1: the
  second join overwrites the first and both wait for good (tests/integration/
  test_c10d_node_names.py; the whole finding is in docs/images.md);
- the host's IPC namespace (its /dev/shm: DataLoader workers and NCCL's shared-memory transport
  outgrow the runtimes' 64 MB default), unless `shm_size` asks for a private one of that size;
- `memlock` unlimited (or the most the node may give) and a 64 MiB stack, as NGC's recipes run;
- the job's devices (podman CDI `nvidia.com/gpu=I`, docker `--gpus "device=I,J"`), with
  `CUDA_VISIBLE_DEVICES` renumbered from 0 inside, where the runtime shows only those devices;
- every folder the job's paths name, mounted at the same path (the workdir, the job folder, a
  local checkpoint folder, and gpufleet's own package read-only: the bootstrap and the SDK run
  in any image with Python 3.11+ and torch, and paths in arguments and variables stay true);
- the job's variables by NAME only (`--env NAME`): their values travel through the runtime
  process's environment, never on a command line where `ps` would show a report key.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gpufleet.vocab import Pull

Flavor = Literal["podman", "docker"]
JOB_LABEL = "gpufleet.job"
STACK_BYTES = 64 * 1024 * 1024
NO_LIMIT = -1

# Host variables that mean nothing (or the wrong thing) inside an image: its own PATH, HOME and
# interpreter win; the runtime's own settings stay with the runtime.
_HOST_ONLY = frozenset({
    "PATH", "HOME", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "SHELL", "TMPDIR", "USER",
    "LOGNAME", "MAIL", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV", "PYTHONHOME",
    "PYTHONEXECUTABLE", "XDG_RUNTIME_DIR", "DISPLAY", "NVIDIA_VISIBLE_DEVICES",
})
_HOST_ONLY_PREFIXES = ("CONTAINERS_", "DOCKER_", "SSH_", "CONDA_", "XDG_", "PODMAN_", "BUILDAH_")

# Options gpufleet sets itself, by every name the runtimes accept, with why (the refusal says it).
_SET = {
    ("--network", "--net"): "host network: rendezvous and NCCL reach peers by the node's address",
    ("--pid",): "the host's PID namespace: the pids workers report are the host's",
    ("--uts", "--hostname", "-h"): "the host's hostname: torchrun advertises no name of its own",
    ("--ipc",): "the host's IPC (/dev/shm); ask for a private one with shm_size / --shm-size",
    ("--shm-size",): "use shm_size / --shm-size",
    ("--pull",): "use pull / --pull",
    ("--name",): "gpufleet names each node's container to remove it after the run",
    ("--rm",): "gpufleet removes the container",
    ("--gpus", "--device"): "gpufleet gives the container the job's devices",
    ("--env", "-e", "--env-file"): "the job's variables go in its env: (values stay off command lines)",
    ("--workdir", "-w"): "the container starts in the job's workdir",
    ("--detach", "-d", "--interactive", "-i", "--tty", "-t"): "the node agent follows the container's output",
}
_SET_ULIMITS = ("memlock", "stack")


@dataclass(frozen=True)
class Container:
    """The job's ask: which image, when to pull it, the runtime options it adds. Travels to
    the nodes as JSON inside a run's node plan (`to_json`, `from_json`)."""

    image: str
    pull: Pull = "missing"
    opts: tuple[str, ...] = ()  # each an option with its value, as the user wrote it
    shm_size: str | None = None
    job: str = ""  # the label's value and the container names' prefix
    # more folders to mount where a node has them: a script given by a path outside the
    # workdir (`gpufleet run /opt/recipes/train.py` from elsewhere)
    mounts: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "pull": self.pull, "opts": list(self.opts),
                "shm_size": self.shm_size, "job": self.job, "mounts": list(self.mounts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Container:
        return cls(image=data["image"], pull=data.get("pull", "missing"),
                   opts=tuple(data.get("opts", ())), shm_size=data.get("shm_size"),
                   job=data.get("job", ""), mounts=tuple(data.get("mounts", ())))


class ImageAsk(Protocol):
    """What a job's spec says about its image (`spec.JobSpec` has these fields)."""

    @property
    def image(self) -> str | None: ...

    @property
    def pull(self) -> Pull: ...

    @property
    def container_opts(self) -> list[str]: ...

    @property
    def shm_size(self) -> str | None: ...

    @property
    def script(self) -> str: ...


def container_of(ask: ImageAsk, job: str) -> Container | None:
    """The job's container, or None for a job without an image."""
    if not ask.image:
        return None
    folder = ask.script.rpartition("/")[0] if ask.script.startswith("/") else ""
    return Container(image=ask.image, pull=ask.pull, opts=tuple(ask.container_opts),
                     shm_size=ask.shm_size, job=job, mounts=(folder,) if folder else ())


def package_dir() -> str:
    """gpufleet's own package folder on this host: mounted read-only into the container, so the
    bootstrap and the SDK run from the same code the node agent runs."""
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class NodeSide:
    """What only the node knows, found there before the start (backends/runtime.py)."""

    runtime: str  # the runtime's path (or name on PATH)
    flavor: Flavor
    python: str = "python3"  # the image's interpreter
    memlock: int = NO_LIMIT  # bytes, or NO_LIMIT where the node may raise the limit
    # the runtime's configured default ulimits, passed again (backends/runtime.py
    # configured_ulimits: podman drops them when a command line has any --ulimit)
    ulimits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Mount:
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class Wrapped:
    """The runtime's command, the environment to start it with, and the command that removes
    the container afterwards (however the run ended)."""

    argv: list[str]
    env: dict[str, str]
    cleanup: list[str] = field(default_factory=list)
    name: str = ""


def split_opts(opts: Sequence[str]) -> list[str]:
    """Each option string as the runtime will get it: `--cap-add SYS_PTRACE` is two words."""
    return [word for opt in opts for word in shlex.split(opt)]


def opt_problems(opts: Sequence[str]) -> list[tuple[str, str]]:
    """One problem per option that gpufleet sets itself (or that is not an option at all), each
    naming the option and why; the same for podman and docker."""
    try:
        words = split_opts(opts)
    except ValueError as exc:
        return [("container_opt", f"cannot split {list(opts)!r}: {exc}")]
    problems: list[tuple[str, str]] = []
    if words and not words[0].startswith("-"):
        problems.append(("container_opt", f"'{words[0]}' is not an option: each container_opt "
                                          "is a runtime option such as --cap-add=SYS_PTRACE"))
    for i, word in enumerate(words):
        if not word.startswith("-"):
            continue
        name, eq, value = word.partition("=")
        for names, why in _SET.items():
            if name in names:
                problems.append(("container_opt", f"{name} is set by gpufleet ({why}); allowed: "
                                                  "any other option of podman/docker run"))
        if name == "--ulimit":
            limit = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            kind = limit.partition("=")[0]
            if kind in _SET_ULIMITS:
                problems.append(("container_opt", f"--ulimit {kind} is set by gpufleet "
                                                  f"({', '.join(_SET_ULIMITS)} as NGC recipes "
                                                  "run); other limits are allowed"))
    return problems


def name_of(c: Container, node: str, run: str) -> str:
    """The container's name: one per job, node and run, in the characters runtimes allow."""
    raw = f"gpufleet-{c.job}-{node}-{run}"
    return "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in raw)


def job_mounts(env: Mapping[str, str], cwd: str, package_dir: str) -> list[Mount]:
    """The folders a run's paths name: its workdir, job folder, a local checkpoint folder, and
    gpufleet's package (read-only), each once."""
    paths = [cwd, env.get("GPUFLEET_JOB_DIR", "")]
    to = env.get("GPUFLEET_CHECKPOINT_TO", "")
    paths.append(to.removeprefix("file://") if to.startswith(("/", "file:///")) else "")
    out = [Mount(p) for p in dict.fromkeys(p.rstrip("/") or "/" for p in paths if p)]
    return [*out, Mount(package_dir, read_only=True)]


def inside_env(env: Mapping[str, str]) -> list[str]:
    """The names of the variables the workers get inside: the job's, not the host's own."""
    return sorted(k for k in env if k not in _HOST_ONLY and not k.startswith(_HOST_ONLY_PREFIXES)
                  and k.isidentifier())


def devices(env: Mapping[str, str]) -> list[int]:
    """The host's device indices the run is pinned to (empty for a CPU run, simulated devices
    included: they run as CPU workers, and there is no GPU to give the container)."""
    if env.get("GPUFLEET_DEVICE") == "cpu":
        return []
    text = env.get("CUDA_VISIBLE_DEVICES", "")
    return [int(d) for d in text.split(",") if d.strip().isdigit()]


def device_args(flavor: Flavor, indices: Sequence[int]) -> list[str]:
    if not indices:
        return []
    if flavor == "podman":
        return [w for i in indices for w in ("--device", f"nvidia.com/gpu={i}")]
    return ["--gpus", '"device=' + ",".join(str(i) for i in indices) + '"']


def wrap(c: Container, node: NodeSide, argv: Sequence[str], env: Mapping[str, str], cwd: str,
         package_dir: str, node_name: str, run: str,
         exists: Callable[[str], bool] = lambda _p: True) -> Wrapped:
    """The launcher `argv` (its first word the host's python) inside `c.image` on this node.
    `exists`: whether a folder is here (a PYTHONPATH entry that is not mounted is dropped: the
    host's site-packages mean nothing inside; a script's folder this node lacks is not mounted)."""
    name = name_of(c, node_name, run)
    mounts = job_mounts(env, cwd, package_dir)
    mounts += [Mount(m) for m in c.mounts
               if exists(m) and not any(_under(m, k.path) for k in mounts)]
    inner = dict(env)
    pinned = devices(env)
    if "CUDA_VISIBLE_DEVICES" in env:
        inner["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(pinned)))
    package_parent = package_dir.rstrip("/").rpartition("/")[0] or "/"
    inner["PYTHONPATH"] = ":".join(dict.fromkeys(
        [p for p in env.get("PYTHONPATH", "").split(":")
         if p and any(_under(p, m.path) for m in mounts) and exists(p)] + [package_parent]))
    memlock = str(node.memlock)
    opts = [node.runtime, "run", "--rm", "--name", name, "--label", f"{JOB_LABEL}={c.job}",
            "--pull", c.pull, "--network", "host", "--pid", "host", "--uts", "host",
            *(["--shm-size", c.shm_size] if c.shm_size else ["--ipc", "host"]),
            "--ulimit", f"memlock={memlock}:{memlock}",
            "--ulimit", f"stack={STACK_BYTES}:{STACK_BYTES}",
            *[w for u in node.ulimits for w in ("--ulimit", u)],
            *device_args(node.flavor, pinned),
            *[w for m in mounts for w in ("-v", f"{m.path}:{m.path}" + (":ro" if m.read_only else ""))],
            "--workdir", cwd,
            *[w for k in inside_env(inner) for w in ("--env", k)],
            *split_opts(c.opts), c.image, node.python, *argv[1:]]
    return Wrapped(opts, inner, cleanup_argv(node, name), name)


def started_line(c: Container, node: NodeSide, wrapped: Wrapped, node_name: str) -> str:
    """What the run's output says first on a node: the image, the runtime, the container."""
    return (f"{node_name}: launcher in image {c.image} ({node.flavor}, {node.python}, "
            f"container {wrapped.name})")


def cleanup_argv(node: NodeSide, name: str) -> list[str]:
    """Remove one container whatever its state (nothing to do is not an error to the keeper)."""
    return [node.runtime, "rm", "-f", name]


def leftovers_argv(node: NodeSide, job: str) -> list[str]:
    """The ids of a job's containers on this node, running or not (then `rm -f` each)."""
    return [node.runtime, "ps", "-a", "-q", "--filter", f"label={JOB_LABEL}={job}"]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def dumps(c: Container) -> str:
    return json.dumps(c.to_json(), sort_keys=True)
