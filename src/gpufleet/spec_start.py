"""How a job's workers start (`warm`, `preload`), checked where the spec is: the same one-line
errors from flags, a job file and the API. The launcher that reads them is launch/warm.py."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def check_preload(v: Any) -> list[str]:
    """Module names from a list or one comma-separated string (`--preload a,b`)."""
    items = v.split(",") if isinstance(v, str) else list(v or [])
    names = [str(m).strip() for m in items if str(m).strip()]
    for name in names:
        if not _MODULE_RE.fullmatch(name):
            shown = name if len(name) <= 60 else name[:57] + "..."
            raise ValueError(f"'{shown}' is not a module name: use importable names such as "
                             "transformers,datasets")
    return list(dict.fromkeys(names))


Preload = Annotated[list[str], BeforeValidator(check_preload)]


def start_problems(warm: bool, preload: list[str]) -> list[tuple[str, str]]:
    """Rules across the two fields: a preload list only means something to a warm start."""
    if preload and not warm:
        return [("preload", "modules are preloaded for warm starts only; drop --no-warm "
                 "(warm: false) or --preload")]
    return []
