"""The team dashboard's sums (`server/board.py`): each (user, team) pair is `ledger.usage` of its
own rows, so a user's pairs add up to their `gpufleet usage` group to the micro-dollar."""

from __future__ import annotations

from gpufleet.lifecycle import ledger
from gpufleet.server import board
from gpufleet.store import LedgerRow


def _row(job: str, user: str, team: str | None, micro: int, hours: float, devices: int = 1
         ) -> LedgerRow:
    return LedgerRow(job_id=0, job=job, user=user, team=team, gpu="cpu", devices=devices,
                     price_book=None, usd_per_hour=0.09, start=0.0,
                     end=hours * 3600.0 / devices, micro_usd=micro, open=False)


def test_pairs_add_up_to_each_users_usage_exactly() -> None:
    rows = [_row("a1", "alice", "ml", 333_333, 1.0), _row("a2", "alice", "ml", 1, 0.5, 2),
            _row("a3", "alice", "lab", 7, 0.25),  # alice moved teams: billed to each in turn
            _row("b1", "bob", None, 10, 2.0)]
    pairs = board.by_user_and_team(rows)
    assert [(p["user"], p["team"], p["micro_usd"]) for p in pairs] == [
        ("alice", "lab", 7), ("alice", "ml", 333_334), ("bob", "-", 10)]
    assert pairs[1]["usd"] == 0.333334 and pairs[1]["gpu_hours"] == 1.5
    by_user = {g["user"]: g["micro_usd"] for g in ledger.usage(rows, "user")["groups"]}
    summed: dict[str, int] = {}
    for p in pairs:
        summed[p["user"]] = summed.get(p["user"], 0) + p["micro_usd"]
    assert summed == by_user


def test_the_month_window_starts_at_the_utc_month_and_the_other_30_days_back() -> None:
    now = 1_796_192_966.0  # 2026-12-02 06:29 UTC
    assert board.window_start("month", now) == 1_796_083_200.0  # 2026-12-01 00:00 UTC
    assert board.window_start("30d", now) == now - 30 * 86400
