"""`GET /api`: the routes an app answers, read from the app itself so the index cannot drift
from what is served. Each route's line is its endpoint's docstring (first line), or, for a
route whose module documents it elsewhere, the line a caller passes in `described`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Mount

INDEX_PATHS = ("/api", "/api/")  # both answer; the index lists the first
STATIC_LINE = "The page's own scripts and styles."


def index(app: FastAPI, described: Mapping[tuple[str, str], str] | None = None
          ) -> list[dict[str, str]]:
    """[{"path", "method", "description"}] for every route of `app`, by path then method.
    `described`: (method, path) -> description, for endpoints without a docstring."""
    out: list[dict[str, str]] = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            if route.path in INDEX_PATHS[1:]:
                continue
            for method in sorted((route.methods or set()) - {"HEAD"}):
                line = (described or {}).get((method, route.path)) or _first_line(route)
                out.append({"path": route.path, "method": method, "description": line})
        elif isinstance(route, Mount):
            out.append({"path": f"{route.path}/{{file}}", "method": "GET",
                        "description": STATIC_LINE})
    return sorted(out, key=lambda r: (r["path"], r["method"]))


def _first_line(route: APIRoute) -> str:
    doc: Any = getattr(route.endpoint, "__doc__", None)
    return doc.strip().splitlines()[0].strip() if isinstance(doc, str) and doc.strip() else ""
