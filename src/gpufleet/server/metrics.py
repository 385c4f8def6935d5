"""The team server's `/metrics`: the single-user dashboard's (`web/prom.py`, of the jobs the
caller may see) plus the ledger's totals, the queue and each team's limits, the same numbers
as `gpufleet usage`, `gpufleet jobs` and the Usage panel (`board.py`).

`gpufleet_usage_usd_total` and `gpufleet_usage_gpu_hours_total` count this calendar month
(UTC) and so fall to zero when a month starts, which Prometheus' `rate` and `increase` read as
a counter reset; the `_30d_` gauges are `gpufleet usage`'s default window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gpufleet.lifecycle import jobs, ledger, listing, teams
from gpufleet.lifecycle.accounts import Identity
from gpufleet.server import board
from gpufleet.store import Store
from gpufleet.web import prom


class TeamCollector(Collector):
    def __init__(self, store: Store, me: Identity):
        self.store = store
        self.me = me

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        ledger.accrue(self.store, now)
        pair = ["user", "team"]
        month_usd = CounterMetricFamily(
            "gpufleet_usage_usd", "Dollars booked in the ledger this calendar month (UTC)",
            labels=pair)
        month_hours = CounterMetricFamily(
            "gpufleet_usage_gpu_hours", "GPU-hours booked in the ledger this calendar month "
            "(UTC)", labels=pair)
        days_usd = GaugeMetricFamily("gpufleet_usage_30d_usd",
                                     "Dollars booked in the ledger in the last 30 days",
                                     labels=pair)
        days_hours = GaugeMetricFamily("gpufleet_usage_30d_gpu_hours",
                                       "GPU-hours booked in the ledger in the last 30 days",
                                       labels=pair)
        for w, usd, hours in (("month", month_usd, month_hours), ("30d", days_usd, days_hours)):
            since = board.window_start(w, now)
            for g in board.by_user_and_team(board.user_rows(self.store, self.me, since), since):
                usd.add_metric([g["user"], g["team"]], g["usd"])
                hours.add_metric([g["user"], g["team"]], g["gpu_hours"])
        yield from (month_usd, month_hours, days_usd, days_hours)

        queue = GaugeMetricFamily("gpufleet_queue_jobs", "Jobs waiting in the queue "
                                  "(status queued) and running, by status", labels=["status"])
        counts = {str(s): 0 for s in ("queued", *jobs.ACTIVE)}
        for r in listing.table(self.store, self.me, now):
            if r["status"] in counts:
                counts[r["status"]] += 1
        for status, n in counts.items():
            queue.add_metric([status], n)
        yield queue

        budget = GaugeMetricFamily("gpufleet_team_budget_usd", "The team's budget this month",
                                   labels=["team"])
        spent = GaugeMetricFamily("gpufleet_team_spent_usd", "What the team's jobs have spent "
                                  "this month (UTC)", labels=["team"])
        quota = GaugeMetricFamily("gpufleet_team_quota_devices", "The most devices of a type "
                                  "the team's jobs may hold at once", labels=["team", "gpu_type"])
        in_use = GaugeMetricFamily("gpufleet_team_devices_in_use", "Devices of a type the "
                                   "team's running jobs hold now", labels=["team", "gpu_type"])
        for team in board.visible_teams(self.store, self.me):
            v = teams.team_view(self.store, team, now)
            if v["budget_usd"] is not None:
                budget.add_metric([team], v["budget_usd"])
            spent.add_metric([team], v["spent_usd"])
            for gpu in sorted(set(v["quotas"]) | set(v["in_use"])):
                if gpu in v["quotas"]:
                    quota.add_metric([team, gpu], v["quotas"][gpu])
                in_use.add_metric([team, gpu], v["in_use"].get(gpu, 0))
        yield from (budget, spent, quota, in_use)


def registry(store: Store, me: Identity) -> CollectorRegistry:
    """What one scrape by `me` sees: an admin every job; a user their own jobs and team."""
    reg = prom.registry(store, None if me.admin else me.user)
    reg.register(TeamCollector(store, me))
    return reg
