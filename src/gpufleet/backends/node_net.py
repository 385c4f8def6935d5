"""The network a node's workers use, chosen on the node by its agent, for every engine.

gloo and NCCL pick an interface by resolving the host's name, which on a real machine is often
127.0.1.1 or an interface the other nodes cannot reach: the job then hangs until torch's
rendezvous timeout. So the agent (node_agent.NodeAgent), before it starts torchrun:

- sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, unless the job or the node already set them,
  to the interface this node's route to the head leaves from (the interface holding the source
  address the kernel picks for the head; on the head itself, the one holding its own address;
  `lo` for loopback pools, as `launch.multinode` already asks);
- on every node but the head, opens a TCP connection to the head's rendezvous endpoint, trying
  for up to REACH_S (the head's torchrun may still be starting), and fails with one line naming
  the node, the endpoint and the interface when it cannot, instead of waiting for torch.

The endpoint comes in the node's environment as GPUFLEET_RDZV_ENDPOINT (launch.multinode).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping

ENDPOINT_ENV = "GPUFLEET_RDZV_ENDPOINT"
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
REACH_S = 30.0


class RendezvousUnreachableError(RuntimeError):
    """This node cannot open a TCP connection to the head's rendezvous endpoint."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def iface_holding(address: str, if_addrs: Mapping[str, list[str]]) -> str | None:
    """The interface that holds `address` (`if_addrs`: interface -> its addresses); loopback
    addresses are `lo`'s whichever interface lists them."""
    if address.startswith("127.") or address == "::1":
        return "lo"
    return next((name for name, addrs in sorted(if_addrs.items()) if address in addrs), None)


def ifname_env(env: Mapping[str, str], node_env: Mapping[str, str], iface: str | None,
               ) -> dict[str, str]:
    """The interface variables to add: those neither the job (`env`) nor the node's own
    environment (`node_env`) sets."""
    if iface is None:
        return {}
    return {k: iface for k in IFNAME_VARS if k not in env and k not in node_env}


def source_address(head: str) -> str:
    """The address this machine's route to `head` leaves from (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in head else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((head, 9))
        return str(probe.getsockname()[0])


def local_ifaces() -> dict[str, list[str]]:
    import psutil

    return {name: [a.address for a in addrs]
            for name, addrs in psutil.net_if_addrs().items()}


def reach(host: str, port: int, within_s: float, now: Callable[[], float] = time.monotonic,
          ) -> bool:
    """Whether a TCP connection to host:port opens within `within_s` (tried every 0.5 s)."""
    deadline = now() + within_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return True
        except OSError:
            if now() >= deadline:
                return False
            time.sleep(0.5)


def prepare(node: str, env: Mapping[str, str], node_env: Mapping[str, str],
            within_s: float = REACH_S) -> dict[str, str]:
    """What to add to a node's environment before its torchrun (see the module docstring);
    RendezvousUnreachableError when a node other than the head cannot reach the head."""
    endpoint = env.get(ENDPOINT_ENV)
    if not endpoint:
        return {}
    head, port = split_endpoint(endpoint)
    try:
        iface = iface_holding(source_address(head), local_ifaces())
    except OSError:  # no route to the head at all
        iface = None
    added = ifname_env(env, node_env, iface)
    if env.get("GPUFLEET_NODE", "head") != "head" and not reach(head, port, within_s):
        via = env.get("GLOO_SOCKET_IFNAME") or node_env.get("GLOO_SOCKET_IFNAME") or iface
        raise RendezvousUnreachableError(
            f"node {env.get('GPUFLEET_NODE')} ({node}) cannot reach the rendezvous {head}:{port} over "
            f"{via or 'any interface (no route)'} within {within_s:.0f} s")
    return added
