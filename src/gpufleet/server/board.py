"""What the team dashboard's Usage panel and the server's `/metrics` show of the ledger and
the teams, as one caller may see it: an admin every user and team; a user their own usage and
their team's (its quotas, budget, and what all its members spent, which is what its budget is
charged with).

The sums are `ledger.usage`'s, the same as `gpufleet usage` prints, and the team figures are
`teams.team_view`'s, the same as `gpufleet admin teams`; nothing is summed a second way here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpufleet.lifecycle import accounts, ledger, teams
from gpufleet.lifecycle.accounts import Identity
from gpufleet.store import LedgerRow, Store

DAYS_30_S = 30 * 86400.0
WINDOWS = ("month", "30d")  # this calendar month (UTC), and `gpufleet usage`'s default window


def window_start(window: str, now: float) -> float:
    return ledger.month_start(now) if window == "month" else now - DAYS_30_S


def visible_teams(store: Store, me: Identity) -> list[str]:
    names = teams.team_names(store)
    return names if me.admin else [t for t in names if t == me.team]


def user_rows(store: Store, me: Identity, since: float) -> list[LedgerRow]:
    """Ledger rows after `since` of every user (an admin) or of `me` only."""
    return ledger.rows(store, since, None if me.admin else me.user)


def team_rows(store: Store, me: Identity, since: float) -> list[LedgerRow]:
    """Ledger rows after `since` of every team (an admin), or of `me`'s team: all its members'."""
    if me.admin:
        return ledger.rows(store, since)
    return [] if me.team is None else ledger.rows(store, since, team=me.team)


def by_user_and_team(found: Iterable[LedgerRow], since: float | None = None
                     ) -> list[dict[str, Any]]:
    """`ledger.usage` of each (user, team) pair's rows: what the metrics label both with. The
    pairs of one user add up to that user's `usage(..., "user")` group, to the micro-dollar."""
    pairs: dict[tuple[str, str], list[LedgerRow]] = {}
    for r in found:
        pairs.setdefault((r.user or "-", r.team or "-"), []).append(r)
    out = []
    for (user, team), rows in sorted(pairs.items()):
        got = ledger.usage(rows, "user", since)
        out.append({"user": user, "team": team, "usd": got["usd"],
                    "micro_usd": got["micro_usd"], "gpu_hours": got["gpu_hours"]})
    return out


def usage_summary(store: Store, me: Identity, now: float) -> dict[str, Any]:
    """The Usage panel: per user and per team for each window, and each visible team's view.
    Books running jobs up to `now` first, as `gpufleet usage` does."""
    ledger.accrue(store, now)
    windows = []
    for w in WINDOWS:
        since = window_start(w, now)
        windows.append({"window": w, "since": since,
                        "users": ledger.usage(user_rows(store, me, since), "user", since),
                        "teams": ledger.usage(team_rows(store, me, since), "team", since)})
    return {"now": now, "month": accounts.current_month(now), "windows": windows,
            "teams": [teams.team_view(store, t, now) for t in visible_teams(store, me)]}
