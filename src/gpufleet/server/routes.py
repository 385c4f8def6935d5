"""One line on each /api/v1 route of the team server whose endpoint has no docstring, for its
`GET /api` index (`web.routes.index`); the routes themselves are read from the app. A route
added without a docstring or a line here shows with an empty description, which
tests/unit/test_route_index.py refuses. docs/queue.md has the same table for people. The paths
are `paths.py`'s, the ones the routes are declared with and the CLI calls.
"""

from __future__ import annotations

from gpufleet.server import paths as p

DESCRIBED: dict[tuple[str, str], str] = {
    ("GET", p.VERSION): "The API version and gpufleet's version (no token needed).",
    ("GET", p.WHOAMI): "The caller: user, team, admin.",
    ("GET", p.HEALTH): "The server loop's last beat: when, jobs queued and active, error.",
    ("POST", p.JOBS): "Start or queue a job: {spec, queue, cpu_slots}.",
    ("GET", p.JOBS): "The rows of `gpufleet jobs` (?all=, ?user=, ?everyone=: the whole queue).",
    ("GET", p.JOB): "One job's detail, or its queue row while it waits.",
    ("POST", p.JOB_CANCEL): "Cancel a queued job.",
    ("POST", p.JOB_STOP): "Stop a job (or cancel it while queued).",
    ("GET", p.JOB_LOGS): "A job's log from ?offset= (?rank=: one rank's).",
    ("GET", p.USAGE): "The billing ledger summed (?by=user|team|gpu|job, ?since=30d).",
    ("POST", p.CLUSTERS): "Launch a cluster as the caller (its owner): {spec}.",
    ("GET", p.CLUSTERS): "The `list --json` rows: running clusters (?all=: stopped too; ?user=).",
    ("DELETE", p.CLUSTER): "Stop a cluster.",
    ("POST", p.USERS): "Add a user (admin): {name, team, admin}; answers its token.",
    ("GET", p.USERS): "The users (admin).",
    ("DELETE", p.USER): "Remove a user (admin).",
    ("PUT", p.QUOTAS): "Set a team's device quota (admin): {team, gpu, devices}.",
    ("PUT", p.BUDGETS): "Set a team's monthly budget (admin): {team, usd, month}.",
    ("GET", p.TEAMS): "Each team's quotas, budget and use (an admin: all teams).",
    ("GET", p.AUDIT): "The audit trail (admin; ?since=30d, ?user=).",
}
