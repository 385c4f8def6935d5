"""Every /api/v1 path of the team server, written once: the server's routes are declared with
these, its `GET /api` index describes them (`routes.DESCRIBED`), and the CLI's HTTP client
(`cli/client_server.py`) calls them. A path with `{name}` is filled with `at(path, name)`, the
name quoted as one segment. Stdlib only: the CLI imports it at start.
"""

from __future__ import annotations

from gpufleet.server.seg import seg

V1 = "/api/v1"
VERSION = f"{V1}/version"
WHOAMI = f"{V1}/whoami"
HEALTH = f"{V1}/health"
SESSION = f"{V1}/session"
JOBS = f"{V1}/jobs"
JOB = f"{V1}/jobs/{{name}}"
JOB_CANCEL = f"{JOB}/cancel"
JOB_HOLD = f"{JOB}/hold"
JOB_RELEASE = f"{JOB}/release"
JOB_STOP = f"{JOB}/stop"
JOB_LOGS = f"{JOB}/logs"
USAGE = f"{V1}/usage"
USAGE_SUMMARY = f"{V1}/usage/summary"
CLUSTERS = f"{V1}/clusters"
CLUSTER = f"{V1}/clusters/{{name}}"
POOLS = f"{V1}/pools"
USERS = f"{V1}/admin/users"
USER = f"{V1}/admin/users/{{name}}"
QUOTAS = f"{V1}/admin/quotas"
BUDGETS = f"{V1}/admin/budgets"
TEAMS = f"{V1}/admin/teams"
AUDIT = f"{V1}/admin/audit"


def at(path: str, name: str) -> str:
    """`path` with its `{name}` filled: a job, cluster or user name as one path segment (a
    name with a slash is then a 404, not another route)."""
    return path.replace("{name}", seg(name))
