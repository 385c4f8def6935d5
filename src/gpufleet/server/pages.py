"""The dashboard behind the team server: the sign-in, the page (the single-user dashboard's,
plus its Queue and Usage panels, `web/static/team.js`), its read API as the signed-in user,
and `/metrics`.

Signing in sends the token once (POST /api/v1/session); the answer is an HTTP-only,
SameSite=Strict cookie holding it, which `api.py`'s `who` reads like a bearer token, so the
page never keeps the token where its scripts (or anyone else's) could read it. The cookie
only reads (`who` takes it for GET and HEAD alone): SameSite is per site, so a page on another
port or subdomain could post a form with it, and no change goes through without the bearer
header. Without a valid cookie or bearer, `/` is the sign-in form and every other route
answers 401.

A user sees their own jobs (and the clusters those ran on), their own usage and their team;
an admin sees everyone's. The page's code (`/static`) is public: it holds no data.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from gpufleet.errors import ForbiddenError
from gpufleet.lifecycle import accounts, jobs
from gpufleet.lifecycle.accounts import Identity
from gpufleet.server import board, metrics, paths
from gpufleet.server.routes import DESCRIBED
from gpufleet.web import auth, data, routes
from gpufleet.web.app import STATIC, js_value, page_html

if TYPE_CHECKING:
    from gpufleet.server.ctx import Ctx

MAX_TOKEN_CHARS = 512
# the page and the sign-in form: never cached (the page names its user), never framed
PAGE_HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY",
                "Content-Security-Policy": "frame-ancestors 'none'",
                "Referrer-Policy": "no-referrer"}


class SessionIn(BaseModel):
    token: str = Field(max_length=MAX_TOKEN_CHARS)


def as_bearer(request: Request, token: str) -> Request:
    """The same request with `token` as its bearer and no cookie: `who` then checks exactly
    the token pasted, by the rules every API call is held to."""
    headers = [(k, v) for k, v in request.scope["headers"]
               if k not in (b"authorization", b"cookie")]
    headers.append((b"authorization", b"Bearer " + token.encode("ascii")))
    return Request({**request.scope, "headers": headers})


def _cookie_cleared(response: Response, request: Request) -> Response:
    response.delete_cookie(auth.COOKIE, path="/", secure=request.url.scheme == "https",
                           httponly=True, samesite="strict")
    return response


def add_routes(app: FastAPI, ctx: Ctx) -> None:
    store = ctx.store

    def seen_user(me: Identity) -> str | None:
        """Whose jobs `me` may read: everyone's (None) for an admin."""
        return None if me.admin else me.user

    def readable(request: Request, name: str) -> None:
        accounts.may_act_on(ctx.who(request), jobs.get(store, name).user, f"job {name}")

    @app.post(paths.SESSION)
    def sign_in(body: SessionIn, request: Request) -> JSONResponse:
        """Sign in with {token}: answers the caller and sets the HTTP-only session cookie."""
        token = body.token.strip()
        if not token.isascii() or not token.isprintable():
            return JSONResponse({"error": "token: no user has this token", "kind": "NoToken"},
                                status_code=401)
        me = ctx.who(as_bearer(request, token))
        with store.session() as s:
            accounts.audit(s, me, "sign_in", "dashboard")
        response = JSONResponse({"user": me.user, "team": me.team, "admin": me.admin})
        response.set_cookie(auth.COOKIE, token, path="/", secure=request.url.scheme == "https",
                            httponly=True, samesite="strict")
        return response

    @app.delete(paths.SESSION)
    def sign_out(request: Request) -> Response:
        """Sign out: clears the session cookie."""
        return _cookie_cleared(JSONResponse({"signed_out": True}), request)

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request) -> Response:
        """The dashboard page, or the sign-in form without a session."""
        try:
            me = ctx.who(request)
        except ForbiddenError:
            form = HTMLResponse((STATIC / "signin.html").read_text(), status_code=401,
                                headers=PAGE_HEADERS)
            return _cookie_cleared(form, request) if request.cookies.get(auth.COOKIE) else form
        who = js_value({"user": me.user, "team": me.team, "admin": me.admin})
        head = (f"<script>window.GPUFLEET_ME = {who};</script>\n"
                '<script src="/static/team.js" defer></script>')
        return HTMLResponse(page_html(None, head), headers=PAGE_HEADERS)

    @app.get(routes.INDEX_PATHS[0])
    @app.get(routes.INDEX_PATHS[1], include_in_schema=False)
    def api_index(request: Request) -> list[dict[str, str]]:
        """This list: every route, its method and what it does."""
        ctx.who(request)
        return routes.index(app, DESCRIBED)

    # the single-user dashboard's read API (web/app.py), as the signed-in user
    @app.get("/api/clusters")
    def api_clusters(request: Request, all: bool = False) -> list[dict[str, Any]]:
        """Running clusters (?all=true: every one) the caller's jobs ran on (an admin: all)."""
        return data.all_clusters(store, time.time(), active_only=not all,
                                 user=seen_user(ctx.who(request)))

    @app.get("/api/jobs")
    def api_jobs(request: Request, limit: int = Query(100, ge=1, le=1000)
                 ) -> list[dict[str, Any]]:
        """The caller's jobs (an admin: all), newest first, each its view: progress, cost, ETA."""
        return [v.as_dict() for _, _, v in data.views(store, time.time(), limit=limit,
                                                      user=seen_user(ctx.who(request)))]

    @app.get("/api/jobs/{name}")
    def api_job(name: str, request: Request) -> dict[str, Any]:
        """One job's view, cluster, events, findings, newest samples, runs and chart markers."""
        readable(request, name)
        return data.job_detail(store, name, time.time())

    @app.get("/api/jobs/{name}/series")
    def api_series(name: str, request: Request, since: float = 0.0,
                   names: str | None = None) -> dict[str, Any]:
        """A job's chart series after ?since= (?names=a,b), each point [time, value, step]."""
        readable(request, name)
        wanted = [n for n in names.split(",") if n] if names else None
        return data.job_series(store, name, since, wanted, time.time())

    @app.get(paths.USAGE_SUMMARY)
    def usage_summary(request: Request) -> dict[str, Any]:
        """The Usage panel: spend per user and team this month and in 30 days, team limits."""
        return board.usage_summary(store, ctx.who(request), time.time())

    @app.get("/metrics")
    def prometheus(request: Request) -> Response:
        """Prometheus metrics of the jobs and teams the caller may see, the ledger, the queue."""
        me = ctx.who(request)
        return Response(generate_latest(metrics.registry(store, me)),
                        media_type=CONTENT_TYPE_LATEST)

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
