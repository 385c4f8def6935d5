"""An SSH pool's nodes from what each host's probe said, and ssh's failures in one line each.

Pure: a `Host`, the probe's JSON (or ssh's exit code and stderr) and the submitter's gpufleet
version in, a `Node` out. A host that cannot be used is still a node: unhealthy, with a state
saying why (`unreachable: ...`, `no torch`, `gpufleet 0.1.0 here, 0.2.0 on the node`), so
`pool list` shows it and the allocator never places a job on it.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

from gpufleet import catalog
from gpufleet.backends.base import Reach
from gpufleet.backends.ssh_conn import Host
from gpufleet.errors import SpecError
from gpufleet.pool.model import Device, Node

NETWORK = "ethernet"  # between an SSH pool's hosts, unless a hostfile says otherwise
_FINGERPRINT = re.compile(r"(SHA256:[A-Za-z0-9+/=]+)")


def key_refused(host: Host) -> str:
    """The one line for a host that refused our key (BatchMode: no password fallback)."""
    key = host.identity or "(ssh's default keys)"
    fix = (f"add {host.identity}.pub to its authorized_keys" if host.identity else
           "give --identity FILE (or identity= in the hostfile) and add FILE.pub to its "
           "authorized_keys")
    return f"host {host.address} refused the key {key}: {fix}"


def key_changed(host: Host, stderr: str, known_hosts: Path, pool: str) -> str:
    """The one line for a host whose host key is not the one pinned at `pool add`."""
    found = _FINGERPRINT.search(stderr)
    new = f" (it now shows {found.group(1)})" if found else ""
    name = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    return (f"host {host.address}'s host key changed since pool {pool} was added{new}; if "
            f"the machine was reinstalled, pin its new key: gpufleet pool remove {pool} and "
            f"gpufleet pool add ssh ... again, or ssh-keygen -R '{name}' -f {known_hosts}")


def failure(host: Host, code: int | None, stderr: str, known_hosts: Path, pool: str,
            timeout_s: float) -> str:
    """Why ssh to `host` failed, in one line (`code` None: it timed out)."""
    if code is None:
        return f"unreachable: no answer from {host.address}:{host.port} in {timeout_s:g} s"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr or "Host key verification failed" \
            in stderr:
        if "No " in stderr and "host key is known" in stderr:  # a key we never pinned
            return (f"host key unknown: {host.address} has no key pinned in {known_hosts}; "
                    f"add it with gpufleet pool add ssh ... again")
        return "host key changed: " + key_changed(host, stderr, known_hosts, pool)
    if "Permission denied" in stderr:
        return "key refused: " + key_refused(host)
    if code == 127 or "not found" in stderr or "No such file" in stderr:
        return (f"no python: '{host.python}' is not on {host.address} (give --python PATH, or "
                "python= in the hostfile)")
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if code == 255:
        return f"unreachable: {last or 'ssh exited 255'}"
    return f"probe failed (exit {code}): {last or 'no output'}"


def gpu_name(host: Host, reported: str) -> str:
    """The catalog type for a GPU: the hostfile's `gpu=` first, else NVML's name."""
    if host.gpu:  # checked at `pool add`; a catalog that later lacks it says so
        with contextlib.suppress(SpecError):
            return catalog.resolve_gpu(host.gpu, "gpu").name
        return f"unknown:{host.gpu}"
    found = catalog.gpu_from_nvml_name(reported)
    return found.name if found else f"unknown:{reported}"


def devices(host: Host, data: dict[str, Any], healthy: bool) -> tuple[Device, ...]:
    """NVIDIA GPUs when the host has any; else CPU slots (hostfile `slots=`, else its cores),
    each with an equal share of its memory."""
    gpus = data.get("gpus") or []
    if gpus:
        return tuple(Device(id=f"gpu{i}", index=i, gpu=gpu_name(host, str(g.get("name", ""))),
                            memory_bytes=int(g.get("memory_bytes", 0)), healthy=healthy)
                     for i, g in enumerate(gpus))
    slots = host.slots or int(data.get("cores") or 1)
    share = int(data.get("memory_bytes") or 0) // max(1, slots)
    return tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=share, healthy=healthy)
                 for i in range(slots))


def refusal(data: dict[str, Any], version: str) -> str:
    """Why a reachable host cannot run jobs ('' if it can): torch and gpufleet must be
    installed for its Python, gpufleet at the submitter's version."""
    theirs = data.get("gpufleet")
    python = data.get("executable") or "its python"
    if not data.get("torch"):
        return f"no torch: {python} has no torch installed"
    if not theirs:
        return f"no gpufleet: {python} has no gpufleet installed (want {version})"
    if theirs != version:
        return f"gpufleet {version} here, {theirs} on the node: install {version} there"
    return ""


def node_of(host: Host, stdout: str, version: str) -> Node:
    """The node a probe's output describes (healthy only if it can run this gpufleet's jobs)."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except (ValueError, IndexError) as exc:
        return unreachable(host, f"probe failed: unreadable output ({exc})")
    why = refusal(data, version)
    found = data.get("routes")
    found = found if isinstance(found, dict) else {}
    devs = sorted({str(r["dev"]) for r in found.values() if isinstance(r, dict) and r.get("dev")})
    up = "up" + (f" via {', '.join(devs)}" if devs else "")  # the interface to the other hosts
    return Node(id=host.address, address=host.address, devices=devices(host, data, not why),
                inter_fabric=NETWORK, free_disk_bytes=1 << 62, healthy=not why, ref=host.address,
                state=why or up)


def unreachable(host: Host, why: str) -> Node:
    """A host that did not answer (or refused us): its declared slots, none usable."""
    slots = tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=0, healthy=False)
                  for i in range(host.slots or 0))
    gpu: tuple[Device, ...] = ()
    if host.gpu:
        with contextlib.suppress(Exception):
            gpu = (Device(id="gpu0", index=0, gpu=gpu_name(host, host.gpu), memory_bytes=0,
                          healthy=False),)
    return Node(id=host.address, address=host.address, devices=gpu or slots,
                inter_fabric=NETWORK, healthy=False, ref=host.address, state=why)


def reaches(stdout: str) -> list[Reach]:
    """The `--reach` probe's answer, one entry per target asked."""
    try:
        found = json.loads(stdout.strip().splitlines()[-1])
        return [Reach(str(e["address"]), int(e["port"]), bool(e.get("ok")), str(e.get("dev", "")),
                      str(e.get("src", "")), str(e.get("error", ""))) for e in found]
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ConnectionError(f"the reach probe's answer is unreadable: {exc}") from None


def routes(stdout: str) -> dict[str, dict[str, str]]:
    """The interface and source address a host's probe found towards each peer."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        found = data.get("routes") or {}
        return {str(k): {str(a): str(b) for a, b in v.items()} for k, v in found.items()}
    except (ValueError, IndexError, AttributeError):
        return {}
