"""The server's JSON API, /api/v1: every route is a library function of `gpufleet.lifecycle`
called as the caller's identity, so the CLI (through `client.py`), the dashboard and a script
get the same answers and the same refusals.

Every call but /api/v1/version carries a token (`Authorization: Bearer`, or the dashboard's
HTTP-only cookie). Errors are {"error": one line} with the status the error's kind maps to.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gpufleet.errors import (
    AllocationError,
    ConflictError,
    ForbiddenError,
    GpufleetError,
    NotFoundError,
    StateError,
)
from gpufleet.lifecycle import accounts, hold_release, jobs, listing, queued, reconcile, runs
from gpufleet.lifecycle.accounts import Identity
from gpufleet.server import API_VERSION, api_admin, api_clusters, paths
from gpufleet.server.ctx import Ctx, NoToken
from gpufleet.server.loop import Loop
from gpufleet.status import QueueStatus
from gpufleet.store import Store
from gpufleet.web import auth

LOG_CHUNK = 1 << 20  # the most of a log one call returns


class JobIn(BaseModel):
    spec: dict[str, Any]
    queue: bool = True
    cpu_slots: int | None = Field(None, ge=1, le=1024)


def _status(exc: GpufleetError) -> int:
    if isinstance(exc, NoToken):
        return 401
    if isinstance(exc, ForbiddenError):
        return 403
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ConflictError | AllocationError):
        return 409
    if isinstance(exc, StateError):
        return 503
    return 400


def create_api(store: Store, loop: Loop | None = None, owner_token: str | None = None) -> FastAPI:
    """`owner_token`: the local server's token (in its server.json), which acts as the OS user
    who started it, an admin; every other token is a user's."""
    from gpufleet.lifecycle.submit import parse_job
    from gpufleet.views import job_detail

    app = FastAPI(title="gpufleet server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(GpufleetError)
    async def gpufleet_error(_r: Request, exc: GpufleetError) -> JSONResponse:
        return JSONResponse({"error": str(exc), "kind": type(exc).__name__},
                            status_code=_status(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_body(_r: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid')}",
                             "kind": "SpecError"}, status_code=400)

    def who(request: Request) -> Identity:
        header = request.headers.get("authorization")
        token = auth.presented(header, request.cookies.get(auth.COOKIE), None)
        if not (header or "").lower().startswith("bearer ") and \
                request.method not in ("GET", "HEAD"):
            # The cookie only reads: a page on another port or subdomain of this site could
            # post a form with it (SameSite is per site), so every change needs the header.
            raise NoToken("token: a change needs the token as 'Authorization: Bearer TOKEN' "
                          "(the dashboard's cookie only reads)")
        if owner_token is not None and token is not None and \
                secrets.compare_digest(owner_token.encode(), token.encode()):
            return accounts.local_identity(store)
        found = accounts.from_token(store, token)
        if found is None:
            raise NoToken("token: this server needs a user's token (gpufleet login URL "
                          "--token-file FILE; an admin makes one with gpufleet admin user add)"
                          if token is None else "token: no user has this token")
        return found

    def _owner_call(request: Request) -> bool:
        header = request.headers.get("authorization") or ""
        given = header[7:].strip() if header.lower().startswith("bearer ") else ""
        return owner_token is not None and bool(given) and \
            secrets.compare_digest(owner_token.encode(), given.encode())

    def woke() -> None:
        if loop is not None:
            loop.wake()

    from gpufleet.server import pages

    ctx = Ctx(store, who, woke, loop)
    pages.add_routes(app, ctx)
    api_clusters.add_routes(app, ctx)
    api_admin.add_routes(app, ctx)

    @app.get(paths.VERSION)
    def version() -> dict[str, Any]:
        from gpufleet import __version__

        return {"api": API_VERSION, "version": __version__}

    @app.get(paths.WHOAMI)
    def whoami(request: Request) -> dict[str, Any]:
        me = who(request)
        return {"user": me.user, "team": me.team, "admin": me.admin}

    @app.get(paths.HEALTH)
    def health(request: Request) -> dict[str, Any]:
        who(request)
        b = loop.last if loop is not None else None
        return {"beat_at": b.at if b else None, "queued": b.queued if b else None,
                "active": b.active if b else None, "error": b.error if b else None}

    @app.post(paths.JOBS)
    def submit_job(body: JobIn, request: Request) -> dict[str, Any]:
        me = who(request)
        named = body.spec.get("name") or body.spec.get("script") or ""
        with accounts.refusals_audited(store, me, "submit", str(named)):
            spec = parse_job(store, body.spec)
            # CPU slots are this host's to say: only its owner's CLI (the local server) may
            slots = body.cpu_slots if _owner_call(request) else None
            result = queued.run_or_queue(store, spec, me, lambda _offer: None, slots,
                                         queue=body.queue)
        if isinstance(result, tuple):
            job, cluster = result
            try:
                runs.start_detached(store, job, slots)
            except runs.NotStarted as exc:  # the job is failed and its devices freed
                raise StateError(f"server: job {job.name} {exc.why}") from None
            woke()
            return {"name": job.name, "status": "started", "cluster": cluster.name}
        woke()
        return {"name": result.name, "status": result.status}

    @app.get(paths.JOBS)
    def list_jobs(request: Request, all: bool = False, user: str | None = None,
                  everyone: bool = False) -> list[dict[str, Any]]:
        """`everyone`: the whole queue, every user's queued and running jobs (another user's
        without its name unless the caller is an admin), as `gpufleet jobs` shows it."""
        me = who(request)
        if user is not None and not me.admin and user != me.user and not everyone:
            raise ForbiddenError(f"user: only an admin may list {user}'s jobs")
        return listing.table(store, me, time.time(), every=all, user=user, everyone=everyone)

    def _owner(name: str) -> str | None:
        e = queued.entry(store, name)
        if e is not None:
            return e.user
        return jobs.get(store, name).user

    @app.get(paths.JOB)
    def one_job(name: str, request: Request) -> dict[str, Any]:
        me = who(request)
        accounts.may_act_on(me, _owner(name), f"job {name}")
        e = queued.entry(store, name)
        if e is not None and jobs.get_or_none(store, name) is None:
            return {**listing.queued_row(e), "queued": True}
        return job_detail(store, name, time.time())

    @app.post(paths.JOB_CANCEL)
    def cancel(name: str, request: Request) -> dict[str, Any]:
        me = who(request)
        with accounts.refusals_audited(store, me, "cancel", name):
            e = queued.cancel(store, name, me)
        woke()
        return listing.queued_row(e)

    @app.post(paths.JOB_HOLD)
    def hold(name: str, request: Request) -> dict[str, Any]:
        """Hold a queued job: it keeps its place but does not start (its owner or an admin)."""
        me = who(request)
        with accounts.refusals_audited(store, me, "hold", name):
            changed = hold_release.hold(store, name, me)
        woke()
        return {**listing.queued_row(_entry(name)), "changed": changed}

    @app.post(paths.JOB_RELEASE)
    def release(name: str, request: Request) -> dict[str, Any]:
        """Release a held job (an admin's hold only an admin releases)."""
        me = who(request)
        with accounts.refusals_audited(store, me, "release", name):
            changed = hold_release.release(store, name, me)
        woke()
        return {**listing.queued_row(_entry(name)), "changed": changed}

    def _entry(name: str) -> Any:
        e = queued.entry(store, name)
        if e is None:
            raise NotFoundError(f"job: no queued job named '{name}' (gpufleet jobs)")
        return e

    def _started_record(name: str) -> Any:
        """The job's record; for one the queue claimed a moment ago, once it exists."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = jobs.get_or_none(store, name)
            e = queued.entry(store, name)
            if found is not None or e is None or e.status != "started":
                break
            time.sleep(0.2)
        return jobs.get(store, name)

    @app.post(paths.JOB_STOP)
    def stop(name: str, request: Request) -> dict[str, Any]:
        me = who(request)
        e = queued.entry(store, name)
        if e is not None and e.status == "queued":
            with accounts.refusals_audited(store, me, "stop", name):
                gone = queued.cancel(store, name, me)
            woke()
            return {"name": name, "status": gone.status, "reason": gone.reason}
        j = _started_record(name)  # not found: the CLI tries a cluster of that name next
        with accounts.refusals_audited(store, me, "stop", name):
            accounts.may_act_on(me, j.user, f"stop {name}")
        with store.session() as s:
            accounts.audit(s, me, "stop", name)
        ended = runs.stop_job(store, j)
        woke()
        return {"name": ended.name, "status": ended.status, "reason": ended.reason}

    @app.get(paths.JOB_LOGS)
    def logs(name: str, request: Request, offset: int = 0, rank: int | None = None
             ) -> dict[str, Any]:
        me = who(request)
        e = queued.entry(store, name)
        if e is not None and jobs.get_or_none(store, name) is None:
            accounts.may_act_on(me, e.user, f"logs of {name}")
            if e.status not in (QueueStatus.QUEUED, QueueStatus.STARTED):  # started: a moment
                raise ConflictError(f"logs: job '{name}' left the queue without starting "
                                    f"({e.status}{': ' + e.reason if e.reason else ''}); it has "
                                    "no log")
            # no log yet: its queue row, so that `logs` says where it waits (-f: and waits)
            return {"text": "", "offset": 0, "more": False, "active": True,
                    "status": str(e.status), "reason": e.reason,
                    "waiting": listing.queued_row(e)}
        j = reconcile.refresh(store, name)
        accounts.may_act_on(me, j.user, f"logs of {name}")
        if rank is not None and not 0 <= rank < j.world_size:
            raise NotFoundError(f"rank: job {name} has ranks 0..{j.world_size - 1}, not {rank}")
        path = Path(j.job_dir) / ("job.log" if rank is None else f"logs/rank{rank}.log")
        text = b""
        if path.exists():
            with open(path, "rb") as f:
                f.seek(max(0, offset))
                text = f.read(LOG_CHUNK)
        size = path.stat().st_size if path.exists() else 0
        return {"text": text.decode("utf-8", "replace"), "offset": max(0, offset) + len(text),
                "more": max(0, offset) + len(text) < size, "active": j.status in jobs.ACTIVE,
                "status": j.status, "reason": j.reason}

    return app
