"""What a host of an SSH pool has, as the host itself says: run there, print one JSON line.

This file is sent to the node's Python on stdin (`ssh HOST -- PYTHON - PEER...`), never
installed there: a node without gpufleet (or with another version of it) must still say what
it has, so that `pool list` can show why it is refused. Hence the standard library only, and
Python 3.8 syntax at run time (no gpufleet import, no match, no `X | Y` at run time).

It prints: cores, memory (bytes), NVIDIA GPUs (NVML through pynvml, else `nvidia-smi`), the
torch and gpufleet versions installed for that Python (read from package metadata, so torch is
never imported: a probe stays well under a second), and for each PEER the interface and source
address its route leaves from (`ip -o route get PEER`). With `--reach ADDRESS:PORT...` it
says instead whether each opens a TCP connection from the node (`doctor --cluster`).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys


def _version(package: str) -> str | None:
    try:
        from importlib import metadata
    except ImportError:  # Python 3.7: no metadata module; treat as unknown
        return None
    try:
        return metadata.version(package)
    except Exception:
        return None


def _memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _gpus() -> list[dict[str, object]]:
    """NVIDIA GPUs: NVML where pynvml is installed, else `nvidia-smi`, else none."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]

        pynvml.nvmlInit()
        try:
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                found.append({"name": name.decode() if isinstance(name, bytes) else str(name),
                              "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)})
            return found
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    return parse_smi(done.stdout)


def parse_smi(text: str) -> list[dict[str, object]]:
    """`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` (MiB)."""
    found: list[dict[str, object]] = []
    for line in text.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            found.append({"name": name.strip(), "memory_bytes": int(mib.strip()) * 2**20})
    return found


def parse_route(text: str) -> dict[str, str]:
    """`ip -o route get PEER`: {"dev": ..., "src": ...} (either may be missing)."""
    words = text.split()
    return {key: words[i + 1] for i, key in enumerate(words[:-1]) if key in ("dev", "src")}


def _route(peer: str) -> dict[str, str]:
    try:
        done = subprocess.run(["ip", "-o", "route", "get", peer], capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)}
    if done.returncode != 0:
        return {"error": (done.stderr.strip() or "no route").splitlines()[0]}
    return parse_route(done.stdout)


def probe(peers: list[str]) -> dict[str, object]:
    return {"cores": os.cpu_count() or 1, "memory_bytes": _memory_bytes(), "gpus": _gpus(),
            "torch": _version("torch"), "gpufleet": _version("gpufleet"),
            "python": platform.python_version(), "executable": sys.executable,
            "hostname": platform.node(), "routes": {p: _route(p) for p in peers}}


def reach(targets: list[str], timeout_s: float = 3.0) -> list[dict[str, object]]:
    """For each ADDRESS:PORT, whether a TCP connection opens from here, and over which route."""
    import socket

    found: list[dict[str, object]] = []
    for target in targets:
        address, _, port = target.rpartition(":")
        entry: dict[str, object] = {"address": address, "port": int(port), **_route(address)}
        try:
            socket.create_connection((address, int(port)), timeout=timeout_s).close()
            entry["ok"] = True
        except OSError as exc:
            entry["ok"] = False
            entry["error"] = exc.strerror or type(exc).__name__
        found.append(entry)
    return found


if __name__ == "__main__":
    if sys.argv[1:2] == ["--reach"]:
        print(json.dumps(reach(sys.argv[2:])))
    else:
        print(json.dumps(probe(sys.argv[1:])))
