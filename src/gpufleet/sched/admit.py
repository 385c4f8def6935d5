"""Admission: a team's GPU quota and monthly budget, checked before a job's turn counts.

A job held here does not hold up the jobs behind it (it is not the head of the queue for
backfill): the devices it would take are not its to keep while its team is over its limits.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.sched.model import Limits, Waiting
from gpufleet.slot_words import devices_shown


def _usd(value: float) -> str:
    return f"${value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"${value:.6f}"


def never_fits(w: Waiting, limits: Limits) -> str | None:
    """"FIELD: why" for a job its team's limits can never admit: it asks for more than the
    quota, or may cost more over its time limit than the whole monthly budget. Refused at
    submission, and when an admin lowers a limit under a queued job, rather than kept forever."""
    if w.team is None:
        return None
    cap = limits.quotas.get((w.team, w.resource[1]))
    if cap is not None and w.count > cap:
        return (f"count: the job needs {devices_shown(w.resource[1], w.count)} but team {w.team}'s quota is "
                f"{cap} at once; ask an admin to raise it (gpufleet admin quota set {w.team} "
                f"{w.resource[1]} N)")
    budget = limits.budget_of.get(w.team)
    if budget is not None and w.duration_s is not None and w.usd_per_hour > 0:
        cost = w.usd_per_hour * w.duration_s / 3600.0
        if cost > budget:
            return (f"time_limit: the job may cost up to {_usd(cost)} over its time limit, more "
                    f"than team {w.team}'s whole monthly budget ({_usd(budget)}); give a "
                    "shorter --time-limit or ask an admin to raise the budget")
    return None


def quota_problem(w: Waiting, in_use: Mapping[tuple[str, str], int], limits: Limits) -> str | None:
    if w.team is None:
        return None
    gpu = w.resource[1]
    cap = limits.quotas.get((w.team, gpu))
    if cap is None:
        return None
    used = in_use.get((w.team, gpu), 0)
    if used + w.count <= cap:
        return None
    return (f"team {w.team}'s quota is {devices_shown(gpu, cap)} at once and {used} are in use; it starts "
            "when the team's jobs free them")


def budget_problem(w: Waiting, left: Mapping[str, float], limits: Limits) -> str | None:
    """Spent, or this job would overspend it over its time limit (a job without a time limit
    is admitted while anything is left: its cost cannot be told in advance)."""
    if w.team is None or w.team not in left:
        return None
    remaining = left[w.team]
    budget = limits.budget_of.get(w.team)
    of = f" of its {_usd(budget)} monthly budget" if budget is not None else ""
    if remaining <= 0:
        its = f"its {_usd(budget)} monthly budget" if budget is not None else "its budget"
        return (f"team {w.team} has spent {its} this month; an admin can raise "
                f"it (gpufleet admin budget set {w.team} USD) or it waits for next month")
    if w.duration_s is not None and w.usd_per_hour > 0:
        cost = w.usd_per_hour * w.duration_s / 3600.0
        if cost > remaining:
            return (f"it may cost up to {_usd(cost)} over its time limit; team {w.team} has "
                    f"{_usd(remaining)} left{of} this month")
    return None
