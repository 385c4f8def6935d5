"""A team as admins and the dashboard see it: its users, quotas and what its jobs hold now,
its budget this month and what it has spent (from the ledger)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from gpufleet.errors import NotFoundError
from gpufleet.lifecycle import accounts, held, ledger
from gpufleet.store import Quota, Store, Team, User


def in_use(store: Store) -> dict[tuple[str, str], int]:
    """Devices each team holds, by GPU type: its running jobs' clusters and the clusters its
    members launched (`lifecycle.held`)."""
    with store.read() as s:
        return held.by_team(s)


def team_names(store: Store) -> list[str]:
    with store.read() as s:
        return list(s.scalars(select(Team.name).order_by(Team.name)))


def team_view(store: Store, team: str, now: float) -> dict[str, Any]:
    month = accounts.current_month(now)
    with store.read() as s:
        if s.scalar(select(Team.id).where(Team.name == team)) is None:
            raise NotFoundError(f"team: no team named '{team}'")
        quotas = {q.gpu: q.devices for q in s.scalars(select(Quota).where(Quota.team == team))}
        budget = accounts.budgets_for(s, month).get(team)
        members = list(s.scalars(select(User.name).where(User.team == team).order_by(User.name)))
    spent = ledger.spent_since(store, ledger.month_start(now)).get(team, 0.0)
    held = {gpu: n for (t, gpu), n in in_use(store).items() if t == team}
    return {"team": team, "users": members, "quotas": quotas, "in_use": held, "month": month,
            "budget_usd": budget, "spent_usd": spent,
            "left_usd": None if budget is None else budget - spent}
