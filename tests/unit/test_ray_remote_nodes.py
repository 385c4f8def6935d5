"""What a Ray pool whose nodes are other machines needs from the driver and the node agent:
Pythons compared by major.minor, a version mismatch said in one line, and the workers'
interface chosen from the node's own address (pure pieces; the run is
tests/integration/test_ray_machines.py)."""

from __future__ import annotations

import os

from gpufleet.backends.node_driver import iface_env
from gpufleet.backends.ray import MATCH_LEVEL_ENV, init_error_line, version_env

MISMATCH = """Version mismatch: The cluster was started with:
    Ray: 2.60.0
    Python: 3.10.1
This process on node 169.254.9.1 was started with:
    Ray: 2.60.0
    Python: 3.11.7
"""


def test_the_driver_compares_pythons_by_minor_unless_the_user_chose() -> None:
    assert version_env({}) == {MATCH_LEVEL_ENV: "minor"}
    assert version_env({MATCH_LEVEL_ENV: "patch"}) == {}


def test_a_version_mismatch_is_one_line_with_both_sides() -> None:
    line = init_error_line("169.254.9.1:6379", MISMATCH, "(hint)")
    assert "\n" not in line and "(hint)" not in line
    assert line.startswith("pool: the Ray cluster at 169.254.9.1:6379 runs Ray: 2.60.0, "
                           "Python: 3.10.1; this machine has Ray: 2.60.0, Python: 3.11.7")
    assert "major.minor" in line


def test_other_failures_keep_their_first_line_and_the_hint() -> None:
    assert init_error_line("h:1", "Connection refused\nmore", "(hint)") == \
        "pool: cannot reach the Ray cluster at h:1: Connection refused (hint)"


ARGV = ["{python}", "-m", "torch.distributed.run", "--local-addr", "169.254.9.12", "x.py"]
IFACES = {"lo": ["127.0.0.1"], "eth0": ["169.254.9.12", "fe80::1"], "docker0": ["172.17.0.1"]}


def test_the_workers_use_the_interface_holding_the_nodes_address() -> None:
    assert iface_env(ARGV, {}, {}, IFACES) == {"GLOO_SOCKET_IFNAME": "eth0",
                                               "NCCL_SOCKET_IFNAME": "eth0"}


def test_loopback_nodes_use_lo_and_what_the_job_or_node_set_is_kept() -> None:
    loop = [*ARGV[:4], "127.0.43.2", "x.py"]
    assert iface_env(loop, {}, {}, IFACES)["GLOO_SOCKET_IFNAME"] == "lo"
    assert iface_env(ARGV, {"GLOO_SOCKET_IFNAME": "ib0"}, {"NCCL_SOCKET_IFNAME": "ib0"},
                     IFACES) == {}


def test_no_interface_is_named_when_none_holds_the_address() -> None:
    assert iface_env(ARGV, {}, {}, {"lo": ["127.0.0.1"]}) == {}
    assert iface_env(["python", "x.py", "--local-addr"], {}, {}, IFACES) == {}


def test_the_driver_takes_sigterm_back_as_a_stop_request() -> None:
    """ray.init puts in a SIGTERM handler that ends the driver at once; `catch_stop` (called
    again after it) makes SIGTERM a request the watch answers by ending the nodes cleanly."""
    import signal

    from gpufleet.backends.ray_run import Driver

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        driver = Driver({"nodes": []})
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as if another handler had replaced ours
        driver.catch_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert driver.stop_asked
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
