"""A name as one segment of an API path (a name that is not one is then a 404, not another
route). Stdlib only: the CLI imports it at start."""

from __future__ import annotations

from urllib.parse import quote


def seg(name: str) -> str:
    return quote(name, safe="")
