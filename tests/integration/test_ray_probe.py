"""How the probe tells a Ray head from everything else at HOST:PORT, against real sockets on
loopback: nothing listening, a server that speaks another protocol, one that never answers,
and one that answers an HTTP/2 client as a gRPC server must (a SETTINGS frame first)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpufleet.backends import ray_probe
from gpufleet.errors import ConflictError


def _serve(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A one-connection-at-a-time TCP server on a free loopback port, ended afterwards."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                answer(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        done.set()
        thread.join(timeout=5)
        srv.close()


@pytest.fixture
def http1() -> Iterator[str]:
    def answer(conn: socket.socket) -> None:
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    yield from _serve(answer)


@pytest.fixture
def silent() -> Iterator[str]:
    yield from _serve(lambda conn: time.sleep(ray_probe.TCP_TIMEOUT_S + 1))


@pytest.fixture
def grpc_like() -> Iterator[str]:
    def answer(conn: socket.socket) -> None:
        conn.recv(1024)
        conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # an empty SETTINGS frame
    yield from _serve(answer)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nothing_listening_is_refused_with_the_hint() -> None:
    why = ray_probe.reachable(f"127.0.0.1:{_free_port()}")
    assert why is not None and "refused" in why.lower() and "ray status" in why


def test_another_protocol_is_not_a_ray_head(http1: str) -> None:
    why = ray_probe.reachable(http1)
    assert why is not None and "not a Ray head" in why


def test_a_server_that_never_answers_is_told_apart_within_the_timeout(silent: str) -> None:
    started = time.monotonic()
    why = ray_probe.reachable(silent)
    assert why is not None and "did not answer as a Ray head" in why
    assert time.monotonic() - started < 3 * ray_probe.TCP_TIMEOUT_S


def test_a_grpc_server_passes_the_first_look(grpc_like: str) -> None:
    assert ray_probe.reachable(grpc_like) is None


def test_node_tables_turns_a_refusal_into_one_conflict_line(http1: str) -> None:
    with pytest.raises(ConflictError) as caught:
        ray_probe.node_tables(http1, None)
    assert str(caught.value).startswith(f"pool: cannot reach the Ray cluster at {http1}: ")
    assert "\n" not in str(caught.value)
