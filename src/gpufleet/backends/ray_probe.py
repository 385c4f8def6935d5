"""Asking a Ray cluster for its node table, quickly and quietly, in a child process.

Why not `ray.init` here: for a head that refuses the token it retries for about 20 s, printing a
`gcs_client` warning each second, before failing with a bare "Failed to connect"; it also
registers a Ray job for what is only a look. Ray's own GCS client answers an authentication
failure at once, but from C++: it writes to the process's stderr, waits about 40 s for a port
that does not speak Ray, and aborts the whole process when token mode is on and no token is
found. So the look runs here, in `python -m gpufleet.backends.ray_probe ADDRESS`, with the
pool's auth settings in its environment, its stderr captured and a deadline; it prints one JSON
line. The parent turns the outcome into one line a user can act on.

The nodes come back shaped like entries of `ray.nodes()` (NodeID, Alive, NodeManagerAddress,
Resources, Labels), which is what `backends.ray.node_from_ray` reads.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.backends.ray_auth import auth_env
from gpufleet.errors import ConflictError

PROBE_TIMEOUT_S = 20.0  # the slow case only: a gRPC server that is not a Ray head
TCP_TIMEOUT_S = 2.0
HINT = "(is it running? `ray status --address ...` tells)"


# An HTTP/2 client's opening (RFC 9113 §3.4): the preface, then an empty SETTINGS frame. A
# gRPC server (Ray's GCS is one) must answer with a SETTINGS frame of its own, frame type 4.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4


def reachable(address: str, timeout_s: float = TCP_TIMEOUT_S) -> str | None:
    """None if a gRPC server answers at HOST:PORT, else why not, in at most about 2 x
    `timeout_s`: a head that is not there, or a port that speaks something else, is told
    apart before any Ray client waits on it (Ray's waits about 40 s)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.sendall(_H2_PREFACE)
            head = sock.recv(9)
    except TimeoutError:
        return "it accepts connections but did not answer as a Ray head (no gRPC reply)"
    except OSError as exc:
        return f"{exc.strerror or str(exc) or type(exc).__name__} {HINT}"
    if len(head) < 4 or head[3] != _SETTINGS:
        return "something listens there but it is not a Ray head (no gRPC reply; the head's " \
               "GCS port is the one `ray start --head --port` was given, 6379 by default)"
    return None


ADD_FIX = "pass --token-file PATH (print the token on the head with `ray get-auth-token`) " \
          "or set RAY_AUTH_TOKEN"


def node_tables(address: str, token_path: Path | None, token_source: str | None = None,
                timeout_s: float = PROBE_TIMEOUT_S, fix: str = ADD_FIX) -> list[dict[str, Any]]:
    """Every node Ray knows (dead ones too), or a ConflictError saying what is wrong and what
    to do: unreachable, a token missing or refused (`fix` says what to do then: for `pool add`,
    give a token; for a pool already added, add it again), not a Ray head, Ray not installed."""
    why = reachable(address)
    if why is not None:
        raise ConflictError(f"pool: cannot reach the Ray cluster at {address}: {why}")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "gpufleet.backends.ray_probe", address],
                              env=auth_env(os.environ, token_path), capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConflictError(f"pool: something listens at {address} but did not answer as a Ray "
                            f"head within {timeout_s:.0f} s (the head's GCS port is the one "
                            "`ray start --head --port` was given, 6379 by default)") from None
    try:
        answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise ConflictError(f"pool: asking the Ray cluster at {address} for its nodes failed "
                            f"(exit {done.returncode} after {time.monotonic() - started:.1f} s): "
                            f"{(last or ['no output'])[-1].strip()[:300]}") from None
    kind = answer.get("error")
    if kind is None:
        return list(answer["nodes"])
    if kind == "auth" and token_path is None:
        raise ConflictError(f"pool: the Ray cluster at {address} uses token authentication and "
                            f"no token was given: {fix}")
    if kind == "auth":
        raise ConflictError(f"pool: the Ray cluster at {address} refused the token from "
                            f"{token_source or token_path}: {fix}")
    if kind == "no-ray":
        raise ConflictError("pool: Ray is not installed here; install gpufleet's [ray] extra "
                            "(pip install 'ray[train]==2.60.0')")
    raise ConflictError(f"pool: cannot reach the Ray cluster at {address}: {answer['detail']} "
                        f"{HINT}")


def _node_entry(node_id: Any, info: Any, alive_state: int) -> dict[str, Any]:
    return {"NodeID": node_id.hex(), "Alive": info.state == alive_state,
            "NodeManagerAddress": info.node_manager_address,
            "Resources": dict(info.resources_total), "Labels": dict(info.labels)}


def _probe(address: str) -> dict[str, Any]:
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]
        from ray.core.generated import gcs_pb2
    except ImportError:
        return {"error": "no-ray"}
    try:
        client = GcsClient(address=address)
        table = client.get_all_node_info(timeout=10)
    except Exception as exc:  # Ray's AuthenticationError, RpcError, ...: named for the parent
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        auth = type(exc).__name__ == "AuthenticationError" or "InvalidAuthToken" in first
        return {"error": "auth" if auth else "rpc", "detail": first[:300]}
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
    return {"nodes": [_node_entry(k, v, alive) for k, v in table.items()]}


def main(argv: list[str]) -> int:
    print(json.dumps(_probe(argv[0])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
