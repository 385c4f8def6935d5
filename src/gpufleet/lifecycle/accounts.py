"""Users, teams, quotas, budgets and the audit trail, on the store.

A server's users come with a token, shown once and kept as its SHA-256. Without a server (or
through the local one) the caller is the OS user, an admin of their own machine: a `users` row
with that name gives them a team, so its quotas and budget apply to them too.
"""

from __future__ import annotations

import getpass
import hashlib
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet import catalog
from gpufleet.errors import (
    ConflictError,
    ForbiddenError,
    GpufleetError,
    NotFoundError,
    ServerError,
    SpecError,
    StateError,
    excerpt,
)
from gpufleet.spec import check_name
from gpufleet.store import AuditEvent, Budget, Quota, Store, Team, User

MAX_QUOTA = 1_000_000  # devices; anything above is a typo
MAX_BUDGET_USD = 1e12
_MONTH = re.compile(r"(\d{4})-(0[1-9]|1[0-2])")


@dataclass(frozen=True)
class Identity:
    """Who is asking: what they may see and stop, and whom their jobs are billed to."""

    user: str
    team: str | None
    admin: bool


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid without a passwd entry (some containers)
        import os

        return f"uid{os.getuid()}"


def local_identity(store: Store) -> Identity:
    """The OS user, an admin, with the team of the user row of the same name if there is one."""
    name = os_user()
    with store.read() as s:
        row = s.scalar(select(User).where(User.name == name))
    return Identity(name, row.team if row else None, True)


def from_token(store: Store, token: str | None) -> Identity | None:
    if not token:
        return None
    with store.read() as s:
        row = s.scalar(select(User).where(User.token_sha256 == sha256(token)))
    return Identity(row.name, row.team, row.admin) if row else None


def require_admin(who: Identity, what: str) -> None:
    if not who.admin:
        raise ForbiddenError(f"{what}: only an admin may do this, and {who.user} is not one")


def may_act_on(who: Identity, owner: str | None, what: str) -> None:
    """Users act on their own jobs; admins on everyone's. The refusal does not say whose it
    is: one user does not learn another's name from it."""
    if who.admin or owner == who.user:
        return
    raise ForbiddenError(f"{what}: it is not yours ({who.user}); only its owner or an admin "
                         "may do that")


def audit(s: Session, who: Identity | str, action: str, subject: str = "", detail: str = "",
          t: float | None = None) -> None:
    s.add(AuditEvent(time=time.time() if t is None else t,
                     user=who if isinstance(who, str) else who.user, action=action,
                     subject=subject, detail=detail))


@contextmanager
def refusals_audited(store: Store, who: Identity, action: str, subject: str) -> Iterator[None]:
    """A refused request becomes an audit row (`ACTION_refused`, with the refusal as its
    detail), then the refusal goes on to the caller: who tried what and was told no is part of
    the trail, not only what was done. A store that cannot be used is not a refusal."""
    try:
        yield
    except (StateError, ServerError):
        raise
    except GpufleetError as exc:
        with store.session() as s:
            audit(s, who, f"{action}_refused", excerpt(subject, 96), str(exc))
        raise


def named(value: str, what: str) -> str:
    try:
        return check_name(value, what)
    except ValueError as exc:
        raise SpecError([(what, str(exc))]) from None


def _team_row(s: Session, team: str, create: bool) -> Team:
    row = s.scalar(select(Team).where(Team.name == team))
    if row is None:
        if not create:
            known = ", ".join(s.scalars(select(Team.name).order_by(Team.name))) or "none yet"
            raise NotFoundError(f"team: no team named '{team}' (teams: {known}; a team is made "
                                "by `gpufleet admin user add NAME --team TEAM`)")
        row = Team(name=team, created_at=time.time())
        s.add(row)
    return row


def add_user(store: Store, who: Identity, name: str, team: str | None, admin: bool) -> str:
    """Create a user; their token (only ever shown here)."""
    require_admin(who, "admin user add")
    name = named(name, "user")
    if team is not None:
        team = named(team, "team")
    token = secrets.token_urlsafe(32)
    with store.session() as s:
        if s.scalar(select(User).where(User.name == name)) is not None:
            raise ConflictError(f"name: a user named '{name}' already exists "
                                "(gpufleet admin user list)")
        if team is not None:
            _team_row(s, team, create=True)
        s.add(User(name=name, team=team, admin=admin, token_sha256=sha256(token),
                   created_at=time.time()))
        audit(s, who, "user_add", name, f"team {team or '-'}{', admin' if admin else ''}")
    return token


def remove_user(store: Store, who: Identity, name: str) -> None:
    require_admin(who, "admin user remove")
    with store.session() as s:
        row = s.scalar(select(User).where(User.name == name))
        if row is None:
            raise NotFoundError(f"user: no user named '{name}' (gpufleet admin user list)")
        s.delete(row)
        audit(s, who, "user_remove", name)


def users(store: Store) -> list[dict[str, Any]]:
    with store.read() as s:
        return [{"name": u.name, "team": u.team, "admin": u.admin, "created_at": u.created_at}
                for u in s.scalars(select(User).order_by(User.name))]


def set_quota(store: Store, who: Identity, team: str, gpu: str, devices: int | None) -> None:
    """At most `devices` of `gpu` at once for the team's jobs; None removes the cap."""
    require_admin(who, "admin quota set")
    if devices is not None and not 0 <= devices <= MAX_QUOTA:
        raise SpecError([("devices", f"a quota is a number of devices from 0 to {MAX_QUOTA}, "
                          f"not {devices}")])
    gpu = catalog.resolve_gpu(gpu).name
    with store.session() as s:
        _team_row(s, team, create=False)
        row = s.scalar(select(Quota).where(Quota.team == team, Quota.gpu == gpu))
        if devices is None:
            if row is not None:
                s.delete(row)
        elif row is None:
            s.add(Quota(team=team, gpu=gpu, devices=devices))
        else:
            row.devices = devices
        audit(s, who, "quota_set", team, f"{gpu}: {'none' if devices is None else devices}")


def current_month(now: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(now))


def check_month(month: str, now: float) -> str:
    if not _MONTH.fullmatch(month):
        raise SpecError([("month", f"'{month}' is not a month; use YYYY-MM, e.g. "
                          f"{current_month(now)}")])
    if month < current_month(now):
        raise SpecError([("month", f"{month} is in the past; a budget is for this month "
                          f"({current_month(now)}) or a later one")])
    return month


def set_budget(store: Store, who: Identity, team: str, usd: float | None,
               month: str | None, now: float) -> None:
    """The team's budget for `month` (None: every month without its own); `usd` None removes."""
    require_admin(who, "admin budget set")
    if usd is not None and not 0 <= usd <= MAX_BUDGET_USD:  # also refuses nan and inf
        raise SpecError([("usd", f"a budget is dollars from 0 to {MAX_BUDGET_USD:,.0f}, not "
                          f"{usd}")])
    key = "*" if month is None else check_month(month, now)
    with store.session() as s:
        _team_row(s, team, create=False)
        row = s.scalar(select(Budget).where(Budget.team == team, Budget.month == key))
        if usd is None:
            if row is not None:
                s.delete(row)
        elif row is None:
            s.add(Budget(team=team, month=key, usd=usd))
        else:
            row.usd = usd
        audit(s, who, "budget_set", team,
              f"{'every month' if key == '*' else key}: {'none' if usd is None else usd}")


def budgets_for(s: Session, month: str) -> dict[str, float]:
    """Each team's budget in force for `month`."""
    rows = list(s.scalars(select(Budget).where(Budget.month.in_(("*", month)))))
    out = {b.team: b.usd for b in rows if b.month == "*"}
    out.update({b.team: b.usd for b in rows if b.month == month})
    return out


def quotas(s: Session) -> dict[tuple[str, str], int]:
    return {(q.team, q.gpu): q.devices for q in s.scalars(select(Quota))}


def audit_log(store: Store, since: float | None = None, user: str | None = None,
              limit: int = 200) -> list[dict[str, Any]]:
    q = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if since is not None:
        q = q.where(AuditEvent.time >= since)
    if user is not None:
        q = q.where(AuditEvent.user == user)
    with store.read() as s:
        return [{"time": e.time, "user": e.user, "action": e.action, "subject": e.subject,
                 "detail": e.detail} for e in s.scalars(q)]
