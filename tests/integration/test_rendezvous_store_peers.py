"""A head launcher's view of who still holds its rendezvous store (launch/store_peers.py),
with torch's real TCPStore in this process and another process as a peer node's agent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpufleet.backends.local import free_port
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


SLOW_TO_CLOSE = """
import os
import sys
import time

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

shutdown = dynamic_rendezvous.DynamicRendezvousHandler.shutdown


def late(self):  # a node whose agent gets to closing the rendezvous late (a loaded machine)
    time.sleep(2)
    return shutdown(self)


dynamic_rendezvous.DynamicRendezvousHandler.shutdown = late
from torch.distributed.run import main

main(sys.argv[1:])
os._exit(0)  # its connection to the head's store closes now, not after a teardown
"""


def test_a_head_keeps_its_store_for_a_node_that_closes_the_rendezvous_late(tmp_path: Path) -> None:
    """Two nodes' launchers on loopback: the head is gpufleet's warm launcher hosting the store,
    the other plain torchrun whose agent closes the rendezvous 2 s after its workers ended.
    The head's store must still serve it then (torch frees it as the launcher returns)."""
    script = tmp_path / "done.py"
    script.write_text("print('rank done', flush=True)\n")
    port = free_port()

    def args(host: int) -> list[str]:
        return ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "late",
                "--rdzv-conf", f"is_host={host}", "--monitor-interval", "0.1", str(script)]

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    head = subprocess.Popen([sys.executable, "-m", "gpufleet.launch.warm", "--", *args(1)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peer = subprocess.Popen([sys.executable, "-c", SLOW_TO_CLOSE, *args(0)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        peer_out, _ = peer.communicate(timeout=240)
        head_out, _ = head.communicate(timeout=60)
    finally:
        for p in (head, peer):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert (head.returncode, peer.returncode) == (0, 0), (head_out[-2000:], peer_out[-2000:])
    assert "rank done" in head_out and "rank done" in peer_out
    assert "failed to shutdown the rendezvous" not in peer_out, peer_out[-3000:]
    assert "still open on the rendezvous store" not in head_out, head_out[-2000:]
