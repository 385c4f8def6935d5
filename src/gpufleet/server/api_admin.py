"""The server's usage and admin routes, /api/v1/usage and /api/v1/admin/...: the ledger summed
for the caller, users and their tokens, team quotas and budgets, teams against their limits, the
audit trail. Each is a `lifecycle` call as the caller's identity."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NoReturn

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from gpufleet.errors import ForbiddenError, SpecError
from gpufleet.lifecycle import accounts, ledger, teams
from gpufleet.server import paths
from gpufleet.spec import parse_duration

if TYPE_CHECKING:
    from gpufleet.server.ctx import Ctx


class UserIn(BaseModel):
    name: str
    team: str | None = None
    admin: bool = False


class QuotaIn(BaseModel):
    team: str
    gpu: str
    devices: int | None = Field(..., ge=0, le=1_000_000)


class BudgetIn(BaseModel):
    team: str
    usd: float | None
    month: str | None = None


def raise_spec(field: str, message: str) -> NoReturn:
    raise SpecError([(field, message)])


def add_routes(app: FastAPI, ctx: Ctx) -> None:
    store = ctx.store

    @app.get(paths.USAGE)
    def usage(request: Request, by: str = "user", since: str = "30d",
              user: str | None = None, team: str | None = None) -> dict[str, Any]:
        me = ctx.who(request)
        if by not in ledger.GROUPS:
            raise_spec("by", f"'{by}' is not a grouping; allowed: {', '.join(ledger.GROUPS)}")
        try:
            start = time.time() - parse_duration(since)
        except ValueError as exc:
            raise_spec("since", str(exc))
        if not me.admin:
            if user not in (None, me.user) or team not in (None, me.team):
                raise ForbiddenError("usage: only an admin may see other users' or teams' usage")
            user = me.user
        ledger.accrue(store, time.time())
        return ledger.usage(ledger.rows(store, start, user, team), by, start)

    @app.post(paths.USERS)
    def add_user(body: UserIn, request: Request) -> dict[str, Any]:
        token = accounts.add_user(store, ctx.who(request), body.name, body.team, body.admin)
        return {"name": body.name, "team": body.team, "admin": body.admin, "token": token}

    @app.get(paths.USERS)
    def list_users(request: Request) -> list[dict[str, Any]]:
        accounts.require_admin(ctx.who(request), "admin user list")
        return accounts.users(store)

    @app.delete(paths.USER)
    def remove_user(name: str, request: Request) -> dict[str, Any]:
        accounts.remove_user(store, ctx.who(request), name)
        return {"removed": name}

    @app.put(paths.QUOTAS)
    def set_quota(body: QuotaIn, request: Request) -> dict[str, Any]:
        accounts.set_quota(store, ctx.who(request), body.team, body.gpu, body.devices)
        ctx.wake()
        return teams.team_view(store, body.team, time.time())

    @app.put(paths.BUDGETS)
    def set_budget(body: BudgetIn, request: Request) -> dict[str, Any]:
        accounts.set_budget(store, ctx.who(request), body.team, body.usd, body.month, time.time())
        ctx.wake()
        return teams.team_view(store, body.team, time.time())

    @app.get(paths.TEAMS)
    def list_teams(request: Request) -> list[dict[str, Any]]:
        me = ctx.who(request)
        now = time.time()
        return [teams.team_view(store, t, now) for t in teams.team_names(store)
                if me.admin or t == me.team]

    @app.get(paths.AUDIT)
    def audit(request: Request, since: str = "30d", user: str | None = None
              ) -> list[dict[str, Any]]:
        accounts.require_admin(ctx.who(request), "admin audit")
        try:
            start = time.time() - parse_duration(since)
        except ValueError as exc:
            raise_spec("since", str(exc))
        return accounts.audit_log(store, start, user)
