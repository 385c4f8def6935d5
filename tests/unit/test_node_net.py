"""The agent's network choice: the interface that routes to the head, the user's own choice
kept, and a head that cannot be reached said in seconds."""

import socket
import time

import pytest

from gpufleet.backends import node_net

IFS = {"lo": ["127.0.0.1", "::1"], "eth0": ["169.254.7.12", "fe80::1"], "eth1": ["10.0.0.5"]}


def test_the_interface_is_the_one_holding_the_routes_source_address() -> None:
    assert node_net.iface_holding("169.254.7.12", IFS) == "eth0"
    assert node_net.iface_holding("10.0.0.5", IFS) == "eth1"
    assert node_net.iface_holding("127.0.1.1", IFS) == "lo"  # loopback is lo's
    assert node_net.iface_holding("192.0.2.1", IFS) is None


def test_a_choice_the_job_or_the_node_made_is_kept() -> None:
    assert node_net.ifname_env({}, {}, "eth0") == {"GLOO_SOCKET_IFNAME": "eth0",
                                                   "NCCL_SOCKET_IFNAME": "eth0"}
    assert node_net.ifname_env({"GLOO_SOCKET_IFNAME": "lo"}, {"NCCL_SOCKET_IFNAME": "ib0"},
                               "eth0") == {}
    assert node_net.ifname_env({}, {}, None) == {}


def test_the_head_over_loopback_gets_lo_and_a_worker_reaches_a_listening_head() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        env = {node_net.ENDPOINT_ENV: f"127.0.0.1:{port}", "GPUFLEET_NODE": "worker1"}
        assert node_net.prepare("n2", env, {}) == {"GLOO_SOCKET_IFNAME": "lo",
                                                   "NCCL_SOCKET_IFNAME": "lo"}


def test_a_worker_that_cannot_reach_the_head_fails_naming_node_endpoint_and_interface() -> None:
    with socket.socket() as taken:  # a port nobody listens on
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        env = {node_net.ENDPOINT_ENV: f"127.0.0.1:{port}", "GPUFLEET_NODE": "worker1"}
        t0 = time.monotonic()
        with pytest.raises(node_net.RendezvousUnreachableError) as err:
            node_net.prepare("n2", env, {}, within_s=1.0)
        assert time.monotonic() - t0 < 30  # bounded, not torch's timeout
    assert str(err.value) == (f"node worker1 (n2) cannot reach the rendezvous 127.0.0.1:{port} "
                              "over lo within 1 s")
    # the head never waits on itself; no endpoint (one node) adds nothing
    assert node_net.prepare("n1", {**env, "GPUFLEET_NODE": "head"}, {}, within_s=1.0)
    assert node_net.prepare("n1", {}, {}) == {}
