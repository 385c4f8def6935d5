"""Which `FleetClient` a command gets: the server this CLI is logged in to, else this machine.
Apart from the interface (`client.py`) so that the implementations, which build its data
types, and the choice between them form no import circle."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet.cli.client import FleetClient


def client() -> FleetClient:
    """The server this CLI talks to ($GPUFLEET_SERVER, or `gpufleet login`), else this
    machine's own state."""
    from gpufleet.home import home_path
    from gpufleet.server.client import configured

    http = configured(home_path())
    if http is not None:
        from gpufleet.cli.client_server import ServerClient

        return ServerClient(http)
    from gpufleet.cli.client_local import LocalClient

    return LocalClient()
