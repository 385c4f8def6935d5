"""One line on each /api/v1 route of the team server whose endpoint has no docstring, for its
`GET /api` index (`web.routes.index`); the routes themselves are read from the app. A route
added without a docstring or a line here shows with an empty description, which
tests/unit/test_route_index.py refuses. docs/queue.md has the same table for people.
"""

from __future__ import annotations

DESCRIBED: dict[tuple[str, str], str] = {
    ("GET", "/api/v1/version"): "The API version and gpufleet's version (no token needed).",
    ("GET", "/api/v1/whoami"): "The caller: user, team, admin.",
    ("GET", "/api/v1/health"): "The server loop's last beat: when, jobs queued and active, error.",
    ("POST", "/api/v1/jobs"): "Start or queue a job: {spec, queue, cpu_slots}.",
    ("GET", "/api/v1/jobs"): "The rows of `gpufleet jobs` (?all=, ?user=, ?everyone=: the whole queue).",
    ("GET", "/api/v1/jobs/{name}"): "One job's detail, or its queue row while it waits.",
    ("POST", "/api/v1/jobs/{name}/cancel"): "Cancel a queued job.",
    ("POST", "/api/v1/jobs/{name}/stop"): "Stop a job (or cancel it while queued).",
    ("GET", "/api/v1/jobs/{name}/logs"): "A job's log from ?offset= (?rank=: one rank's).",
    ("GET", "/api/v1/usage"): "The billing ledger summed (?by=user|team|gpu|job, ?since=30d).",
    ("POST", "/api/v1/clusters"): "Launch a cluster as the caller (its owner): {spec}.",
    ("GET", "/api/v1/clusters"): "The `list --json` rows: running clusters (?all=: stopped too; ?user=).",
    ("DELETE", "/api/v1/clusters/{name}"): "Stop a cluster.",
    ("POST", "/api/v1/admin/users"): "Add a user (admin): {name, team, admin}; answers its token.",
    ("GET", "/api/v1/admin/users"): "The users (admin).",
    ("DELETE", "/api/v1/admin/users/{name}"): "Remove a user (admin).",
    ("PUT", "/api/v1/admin/quotas"): "Set a team's device quota (admin): {team, gpu, devices}.",
    ("PUT", "/api/v1/admin/budgets"): "Set a team's monthly budget (admin): {team, usd, month}.",
    ("GET", "/api/v1/admin/teams"): "Each team's quotas, budget and use (an admin: all teams).",
    ("GET", "/api/v1/admin/audit"): "The audit trail (admin; ?since=30d, ?user=).",
}
