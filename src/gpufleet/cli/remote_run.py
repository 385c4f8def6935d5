"""`run` against a server: the job goes as data, the server checks and starts or queues it,
and this CLI follows it through the API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.cli.app import err, out

if TYPE_CHECKING:
    from gpufleet.server.client import Client


def run_remote(client: Client, data: dict[str, Any], queue: bool, cpu_slots: int | None,
               detach: bool) -> None:
    from gpufleet.cli.follow import RemoteSource, wait_and_follow

    got = client.call("POST", "/api/v1/jobs", {"spec": data, "queue": queue,
                                               "cpu_slots": cpu_slots})
    name = got["name"]
    if got["status"] == "started":
        out.print(f"Job [bold]{name}[/] started on {got['cluster']} (server {client.url}).")
    else:
        err.print(f"Job {name} is queued on {client.url}: gpufleet jobs shows its place; "
                  f"gpufleet cancel {name} takes it out.", highlight=False)
    if detach:
        out.print(f"  follow:  gpufleet logs {name} -f\n  status:  gpufleet status {name}\n"
                  f"  stop:    gpufleet stop {name}")
        return
    wait_and_follow(RemoteSource(client), name)
