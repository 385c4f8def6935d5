"""The head's wait for other nodes' agents to let go of its rendezvous store
(launch/store_peers.py), on tables as the kernel writes them."""

from __future__ import annotations

from gpufleet.launch.store_peers import Conn, parse, peers, store_port, wait_gone

# a store on port 29500 (0x733C): its listener, this process's own client (a socket pair:
# 0x9001 -> 29500 and its accepted twin), and a peer's connection accepted here
TABLE = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:733C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1
   1: 0100007F:9001 0100007F:733C 01 00000000:00000000 00:00000000 00000000     0        0 101 1
   2: 0100007F:733C 0100007F:9001 01 00000000:00000000 00:00000000 00000000     0        0 102 1
   3: 0A00000B:733C 0A00000C:C350 01 00000000:00000000 00:00000000 00000000     0        0 103 1
   4: 0A00000B:733C 0A00000D:C351 06 00000000:00000000 00:00000000 00000000     0        0 0 1
"""


def test_a_peers_connection_counts_and_the_launchers_own_client_does_not() -> None:
    conns = parse(TABLE)
    assert conns[3] == Conn(("0A00000B", 29500), ("0A00000C", 50000), True, 103)
    assert [c.inode for c in peers(conns, 29500, {100, 101, 102, 103})] == [103]
    # a connection this process did not accept (another job's store on the same port number in
    # another process) is not ours to wait for
    assert peers(conns, 29500, {100, 101, 102}) == []


def test_only_a_multi_node_host_waits() -> None:
    head = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.11:29500",
            "--rdzv-conf", "is_host=1", "t.py"]
    assert store_port(head) == 29500
    assert store_port([a.replace("is_host=1", "is_host=0") for a in head]) is None
    assert store_port(["--rdzv_endpoint=h:7", "--rdzv_conf=timeout=9,is_host=1"]) == 7
    assert store_port(["--standalone", "--nnodes", "1", "t.py"]) is None


def test_the_wait_ends_when_the_peers_are_gone_and_is_bounded() -> None:
    seen = iter([2, 1, 0])
    slept: list[float] = []
    one = Conn(("a", 1), ("b", 2), True, 1)
    assert wait_gone(1, look=lambda: [one] * next(seen), sleep=slept.append) == 0
    assert len(slept) == 2
    t = iter(range(100))
    assert wait_gone(1, timeout_s=5, look=lambda: [one], clock=lambda: float(next(t)),
                     sleep=lambda _s: None) == 1


def test_an_unreadable_table_never_holds_the_launcher() -> None:
    def broken() -> list[Conn]:
        raise OSError("no /proc")

    assert wait_gone(1, look=broken) == 0


def test_a_store_on_both_families_knows_its_own_ipv4_client() -> None:
    """The store accepted this process's IPv4 client on an IPv6 socket (tcp6, mapped address):
    still its own client, not a peer to wait for."""
    tcp = parse(TABLE.splitlines()[0] + "\n"
                "   1: 0100007F:9001 0100007F:733C 01 00000000:00000000 00:00000000 00000000"
                "     0        0 101 1\n")
    tcp6 = parse(TABLE.splitlines()[0] + "\n"
                 "   0: 0000000000000000FFFF00000100007F:733C 0000000000000000FFFF00000100007F:9001"
                 " 01 00000000:00000000 00:00000000 00000000     0        0 102 1\n")
    assert tcp6[0].remote == ("0100007F", 0x9001)
    assert peers([*tcp, *tcp6], 29500, {101, 102}) == []
