"""The dashboard app: one static page, a read-only JSON API and `/metrics`.

Nothing here starts a process or reads a file other than the store and the page's own static
files: the API only answers questions about clusters and jobs already recorded.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

from fastapi import FastAPI, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpufleet.errors import GpufleetError, NotFoundError, StateError
from gpufleet.store import Store
from gpufleet.web import auth, data, prom, routes

STATIC = resources.files("gpufleet.web") / "static"
TEAM_MARK = "<!--gpufleet:team-->"  # where a team server adds its own scripts to the page


def create_app(store: Store, token: str | None = None, focus: str | None = None,
               bound: str = "127.0.0.1") -> FastAPI:
    """`token`: required on every request when set (the dashboard is bound beyond loopback);
    without one, only requests addressed to loopback (or `bound`) are answered. `focus`: the
    cluster or job the page opens on."""
    app = FastAPI(title="gpufleet dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    registry = prom.registry(store)

    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Response:
        if token is None and not auth.host_allowed(request.headers.get("host"), bound):
            return JSONResponse({"error": "this dashboard answers requests to 127.0.0.1 or "
                                 "localhost only"}, status_code=403)
        given = auth.presented(request.headers.get("authorization"),
                               request.cookies.get(auth.COOKIE), request.query_params.get("token"))
        if not auth.allowed(token, given):
            why = ("this dashboard is bound beyond loopback, so it needs its token: open the "
                   "URL `gpufleet dashboard` printed (it ends in ?token=...), or send "
                   "'Authorization: Bearer TOKEN'; the token is in $GPUFLEET_HOME/dashboard-token")
            headers = {"WWW-Authenticate": "Bearer"}
            if request.url.path == "/":
                return HTMLResponse(f"<!doctype html><title>gpufleet: token needed</title>"
                                    f"<p>{why}</p>", status_code=401, headers=headers)
            return JSONResponse({"error": why}, status_code=401, headers=headers)
        response: Response = await call_next(request)
        if token is not None and request.query_params.get("token"):
            response.set_cookie(auth.COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.exception_handler(GpufleetError)
    async def gpufleet_error(_request: Request, exc: GpufleetError) -> JSONResponse:
        # A state file that cannot be used is the server's trouble, not the request's.
        status = 404 if isinstance(exc, NotFoundError) else 503 if isinstance(exc, StateError) \
            else 400
        return JSONResponse({"error": str(exc)}, status_code=status)

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        """The dashboard page: every cluster and job, live."""
        return page_html(focus)

    @app.get(routes.INDEX_PATHS[0])
    @app.get(routes.INDEX_PATHS[1], include_in_schema=False)
    def api_index() -> list[dict[str, str]]:
        """This list: every route, its method and what it returns."""
        return routes.index(app)

    @app.get("/api/clusters")
    def api_clusters(all: bool = False) -> list[dict[str, Any]]:
        """Running clusters (?all=true: every one) with their devices, price and cost so far."""
        return data.all_clusters(store, time.time(), active_only=not all)

    @app.get("/api/jobs")
    def api_jobs(limit: int = Query(100, ge=1, le=1000)) -> list[dict[str, Any]]:
        """Jobs, newest first (?limit=100), each its view: progress, cost, ETA, model state."""
        return [v.as_dict() for _, _, v in data.views(store, time.time(), limit=limit)]

    @app.get("/api/jobs/{name}")
    def api_job(name: str) -> dict[str, Any]:
        """One job's view, cluster, events, findings, newest samples, runs and chart markers."""
        return data.job_detail(store, name, time.time())

    @app.get("/api/jobs/{name}/series")
    def api_series(name: str, since: float = 0.0, names: str | None = None) -> dict[str, Any]:
        """A job's chart series after ?since= (?names=a,b), each point [time, value, step]."""
        wanted = [n for n in names.split(",") if n] if names else None
        return data.job_series(store, name, since, wanted, time.time())

    @app.get("/metrics")
    def metrics() -> Response:
        """Prometheus metrics of running clusters and of jobs running or ended < 5 min ago."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    return app


def page_html(focus: str | None, team_head: str = "") -> str:
    """The page, opening on `focus`; `team_head`: the team server's scripts (its Queue and
    Usage panels), left out by the single-user dashboard."""
    html = (STATIC / "index.html").read_text()
    return html.replace("__GPUFLEET_FOCUS__", _js_string(focus or "")).replace(TEAM_MARK,
                                                                                team_head)


def js_value(value: object) -> str:
    """A JSON value to put in the page's inline script, safely (no `</script>` inside)."""
    import json

    return json.dumps(value).replace("<", "\\u003c")


def _js_string(value: str) -> str:
    """A value to put inside a JS string literal in the page, safely."""
    import json

    return json.dumps(value)[1:-1].replace("<", "\\u003c")
