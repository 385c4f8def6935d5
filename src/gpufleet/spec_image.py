"""The container fields of a job (`image`, `container_opts`, `shm_size`), checked where the
spec is: the same one-line errors from flags, a job file and the API, before anything is
reserved. A module of its own so `spec.py` stays the model's shape; the runtime's command is
`launch/container.py`'s, which these checks must agree with (`opt_problems` is its own)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from gpufleet.launch.container import opt_problems

# A reference as podman and docker read it: [REGISTRY[:PORT]/]NAME[/NAME...][:TAG][@DIGEST].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_RE = re.compile(
    rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?")
_SHM_RE = re.compile(r"([0-9]+)\s*([kmg]?)i?b?", re.IGNORECASE)
_SHM_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
MIN_SHM = 1024**3  # DataLoader workers and NCCL's shared memory outgrow less (dstack #1006)


def check_image(v: str) -> str:
    if not _IMAGE_RE.fullmatch(v):
        shown = v if len(v) <= 60 else v[:57] + "..."
        raise ValueError(f"'{shown}' is not an image name: use [REGISTRY/]NAME[:TAG][@DIGEST], "
                         "e.g. nvcr.io/nvidia/pytorch:24.06-py3")
    return v


def shm_bytes(text: str) -> int:
    m = _SHM_RE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"'{text}' is not a size: use a number with k, m or g, e.g. 8g")
    return int(m.group(1)) * _SHM_UNITS[m.group(2).lower()]


def check_shm(v: Any) -> str:
    text = str(v)
    if shm_bytes(text) < MIN_SHM:
        raise ValueError(f"'{text}' is below 1g; DataLoader workers and NCCL need at least 1g "
                         "(leave shm_size out for the host's /dev/shm)")
    m = _SHM_RE.fullmatch(text.strip())
    assert m is not None
    return f"{m.group(1)}{m.group(2).lower()}"  # the form both runtimes take


def check_opts(v: list[str]) -> list[str]:
    problems = opt_problems(v)
    if problems:
        raise ValueError("; ".join(msg for _field, msg in problems))
    return v


ImageRef = Annotated[str, AfterValidator(check_image)]
ShmSize = Annotated[str, BeforeValidator(check_shm)]
ContainerOpts = Annotated[list[str], AfterValidator(check_opts)]
