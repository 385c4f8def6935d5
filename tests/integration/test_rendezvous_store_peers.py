"""A head launcher's view of who still holds its rendezvous store (launch/store_peers.py),
with torch's real TCPStore in this process and another process as a peer node's agent."""

from __future__ import annotations

import subprocess
import sys

from gpufleet.launch.store_peers import _socket_inodes, _tables, peers, wait_gone

PEER = """
import sys
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False)
store.set("closed", "1")
print("connected", flush=True)
sys.stdin.read()
"""


def test_a_peer_agent_holds_the_store_until_it_ends() -> None:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = store.port
    assert peers(_tables(), port, _socket_inodes()) == []  # this process's own client only
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(port)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        assert peer.stdout is not None and peer.stdin is not None
        assert peer.stdout.readline() == b"connected\n"
        assert store.get("closed") == b"1"
        held = peers(_tables(), port, _socket_inodes())
        assert len(held) == 1, held
        peer.stdin.close()
        assert peer.wait(timeout=120) == 0
        assert wait_gone(port, timeout_s=120) == 0  # the wait sees it go, long before this
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
