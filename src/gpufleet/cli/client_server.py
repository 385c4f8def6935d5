"""`FleetClient` through a team server: each method one /api/v1 call (`server/paths.py`) as
the logged-in user; the server checks, refuses and records as it would for any caller."""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from gpufleet.cli.app import confirm, err, out
from gpufleet.cli.client import JobInput, Launched
from gpufleet.errors import NotFoundError, SpecError
from gpufleet.server import paths
from gpufleet.server.client import Client
from gpufleet.server.paths import at


class ServerClient:
    poll_s = 1.0

    def __init__(self, http: Client):
        self.http = http
        self.url = http.url

    def refuse_here_only(self, command: str) -> None:
        raise SpecError([("cluster", f"{command} measures a cluster of this machine's own "
                          f"state, and this CLI works through {self.url}; run it on the "
                          "server's host (gpufleet logout there)")])

    def launch(self, spec: dict[str, Any], yes: bool, as_json: bool,
               cpu_slots: int | None) -> Launched:
        got = self.http.call("POST", paths.CLUSTERS, {"spec": spec})  # checked on its pools
        return Launched(got["name"], got["gpu"], got["count"], f" on {self.url}", got)

    def clusters(self, every: bool) -> list[dict[str, Any]]:
        # yours on the server (every one for an admin), the same rows as here
        rows: list[dict[str, Any]] = self.http.call("GET", paths.CLUSTERS,
                                                    query={"all": str(every).lower()})
        return rows

    def stop(self, name: str | None, every: bool, yes: bool) -> None:
        if every or not name:
            raise SpecError([("all", "with a server, stop jobs by name (gpufleet jobs lists "
                              "yours); --all stops this machine's own clusters after logout")])
        confirm(f"Stop {name}?", yes)
        try:
            got = self.http.call("POST", at(paths.JOB_STOP, name))
            out.print(f"Job {name}: {got['status']}")
        except NotFoundError:  # not a job: a cluster of yours on the server
            got = self.http.call("DELETE", at(paths.CLUSTER, name))
            out.print(f"Cluster {name}: {got.get('status', 'stopped')}, devices freed, cost "
                      f"${got['cost_usd']:.4f}")

    def run(self, job: JobInput, queue: bool, cpu_slots: int | None, detach: bool,
            dry_run: bool, yes: bool) -> None:
        """The job goes as data; the server checks it and starts or queues it, and this CLI
        follows it through the API."""
        from gpufleet.cli.follow import RemoteSource, wait_and_follow
        from gpufleet.cli.job_spec import job_data

        if dry_run:
            raise SpecError([("dry_run", "--dry-run plans on this machine's state; with a "
                              "server it is not available yet (gpufleet logout to plan here)")])
        data = job_data(job.file, job.script, job.args, job.env, job.flags, job.inline,
                        job.cluster)
        got = self.http.call("POST", paths.JOBS, {"spec": data, "queue": queue,
                                                  "cpu_slots": cpu_slots})
        name = got["name"]
        if got["status"] == "started":
            out.print(f"Job [bold]{name}[/] started on {got['cluster']} (server {self.url}).")
        else:
            err.print(f"Job {name} is queued on {self.url}: gpufleet jobs shows its place; "
                      f"gpufleet cancel {name} takes it out.", highlight=False)
        if detach:
            out.print(f"  follow:  gpufleet logs {name} -f\n  status:  gpufleet status {name}\n"
                      f"  stop:    gpufleet stop {name}")
            return
        wait_and_follow(RemoteSource(self.http), name)

    def resume(self, name: str, yes: bool, cpu_slots: int | None, detach: bool) -> None:
        raise SpecError([("resume", "--resume works on this machine's own state; through "
                          "a server it is not available yet (gpufleet logout, on the "
                          "server's host, to resume there)")])

    def job(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.http.call("GET", at(paths.JOB, name))
        return got

    def logs(self, name: str, follow: bool, rank: int | None) -> str:
        """A job still queued is said to be (where it waits) as `logs` says on this machine,
        and -f waits for its start."""
        from gpufleet.cli.follow import queue_line

        offset = 0
        told = False
        while True:
            got = self.http.call("GET", at(paths.JOB_LOGS, name),
                                 query={"offset": offset, "rank": rank})
            waiting = got.get("waiting")
            if waiting is not None:
                if not told:
                    now = "starting" if waiting["status"] == "started" else \
                        queue_line(waiting, time.time())
                    err.print(f"Job {name} is {now}; its log starts when it runs.",
                              markup=False, highlight=False, soft_wrap=True)
                    told = True
                if not follow:
                    raise typer.Exit(0)
                time.sleep(1.0)
                continue
            sys.stdout.write(got["text"])
            sys.stdout.flush()
            offset = got["offset"]
            if got["more"]:
                continue
            if not follow or not got["active"]:
                return str(got["status"])
            time.sleep(1.0)

    def jobs(self, every: bool, user: str | None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.http.call(
            "GET", paths.JOBS, query={"all": str(every).lower(), "user": user,
                                      "everyone": "true"})
        return rows

    def cancel(self, name: str) -> None:
        self.http.call("POST", at(paths.JOB_CANCEL, name))

    def hold(self, name: str) -> bool:
        return bool(self.http.call("POST", at(paths.JOB_HOLD, name))["changed"])

    def release(self, name: str) -> bool:
        return bool(self.http.call("POST", at(paths.JOB_RELEASE, name))["changed"])

    def usage(self, by: str, since: str) -> dict[str, Any]:
        got: dict[str, Any] = self.http.call("GET", paths.USAGE, query={"by": by, "since": since})
        return got

    def pools(self, name: str | None) -> list[dict[str, Any]]:
        # the server's pools: where its clusters are carved from
        got: list[dict[str, Any]] = self.http.call("GET", paths.POOLS, query={"name": name})
        return got

    def add_user(self, name: str, team: str | None, admin: bool) -> str:
        return str(self.http.call("POST", paths.USERS,
                                  {"name": name, "team": team, "admin": admin})["token"])

    def users(self) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = self.http.call("GET", paths.USERS)
        return got

    def remove_user(self, name: str) -> None:
        self.http.call("DELETE", at(paths.USER, name))

    def set_quota(self, team: str, gpu: str, devices: int | None) -> dict[str, Any]:
        got: dict[str, Any] = self.http.call("PUT", paths.QUOTAS,
                                             {"team": team, "gpu": gpu, "devices": devices})
        return got

    def set_budget(self, team: str, usd: float | None, month: str | None) -> dict[str, Any]:
        got: dict[str, Any] = self.http.call("PUT", paths.BUDGETS,
                                             {"team": team, "usd": usd, "month": month})
        return got

    def teams(self) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = self.http.call("GET", paths.TEAMS)
        return got

    def audit(self, since: str, user: str | None) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = self.http.call("GET", paths.AUDIT,
                                                   query={"since": since, "user": user})
        return got
