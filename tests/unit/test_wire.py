"""The worker report's one wire schema: what a worker writes (train.report, over a real UDP
socket, signed with the job's key) is what the supervisor's intake reads, node label included.
"""

from __future__ import annotations

import importlib
import json
import math
import socket
import time
from collections.abc import Iterator

import pytest

from gpufleet.reportauth import KEY_ENV, Verifier, new_key
from gpufleet.store import Cluster, Job
from gpufleet.supervise.events import Reported, WorkerNote
from gpufleet.supervise.intake import Intake
from gpufleet.telemetry import wire

# the module (`gpufleet.train.report` is also the name of the function it exports)
report = importlib.import_module("gpufleet.train.report")
KEY = new_key()


@pytest.fixture
def inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A socket where the worker side sends, as the supervisor's report port; a fresh reporter
    reading this environment."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(30)
    monkeypatch.setenv("GPUFLEET_REPORT_ADDR", f"127.0.0.1:{sock.getsockname()[1]}")
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("GPUFLEET_TELEMETRY", "1")
    monkeypatch.setattr(report, "_reporter", None)
    yield sock
    sock.close()


def _intake() -> Intake:
    return Intake(Job(name="j", total_steps=None, spec_json="{}", world_size=2, samples=0),
                  Cluster(name="c"), KEY)


def test_a_report_written_by_a_worker_is_read_by_the_intake(
        inbox: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(wire.NODE_ENV, "worker1")
    report.progress(7, loss=2.5, samples=64, total_steps=100,
                    metrics={"step_time_seconds": 0.25, "odd": math.nan})
    t_sent = time.time()
    data = inbox.recv(65536)
    i = _intake()
    assert i.datagram(data, lambda pid: False) == [Reported(1, 7)]
    rows = {m.name: m for m in i.pending}
    assert {m.node for m in i.pending} == {"worker1"}  # every row of the rank, not "local"
    assert {m.rank for m in i.pending} == {1}
    assert rows["loss"].value == 2.5 and rows["samples"].value == 64.0
    assert rows["step_time_seconds"].value == 0.25 and rows["step"].value == 7.0
    assert "odd" not in rows  # NaN is not stored ...
    (t, odd), = i.recent.snapshot(now=t_sent + 1)["odd"][1]  # ... but the diagnosis sees it
    assert math.isnan(odd) and abs(t - t_sent) < 60
    assert not {"t", "rank", "pid", "node", "total_steps", "samples_total"} & set(rows)
    assert i.nodes == {1: "worker1"}


def test_what_the_worker_sends_is_the_schema_read_back(
        inbox: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(wire.NODE_ENV, "head")
    report.progress(3, samples=8, source=wire.BOOTSTRAP)
    report.progress(4, samples=8, source=wire.BOOTSTRAP)
    verifier = Verifier(KEY)
    payloads = [json.loads(verifier.open(inbox.recv(65536))) for _ in range(2)]  # type: ignore[arg-type]
    got = [wire.read_progress(p) for p in payloads]
    assert [(p.rank, p.step, p.node, p.source, p.samples_total) for p in got] == [
        (1, 3, "head", "bootstrap", 8), (1, 4, "head", "bootstrap", 16)]


def test_a_rank_on_this_host_is_labelled_local_and_notes_carry_the_node(
        inbox: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(wire.NODE_ENV, raising=False)
    report.progress(1, loss=1.0)
    i = _intake()
    i.datagram(inbox.recv(65536), lambda pid: False)
    assert {m.node for m in i.pending} == {wire.LOCAL}
    monkeypatch.setenv(wire.NODE_ENV, "worker2")
    monkeypatch.setattr(report, "_reporter", None)
    report.send_event("resumed", step=5, path="/ckpt/5")
    events = i.datagram(inbox.recv(65536), lambda pid: False)
    assert WorkerNote("resumed", 1, 5) in events


def test_the_reader_refuses_what_the_schema_does_not_allow() -> None:
    base = wire.progress_record(t=1.0, rank=0, pid=9, step=2, node="head", loss=0.5)
    assert wire.read_progress(base).loss == 0.5
    for bad in ({"loss": "0.5"}, {"samples": [1]}, {"step": None}):
        with pytest.raises((ValueError, TypeError)):
            wire.read_progress({**base, **bad})
    with pytest.raises(KeyError):
        wire.read_progress({k: v for k, v in base.items() if k != wire.STEP})
    assert wire.read_progress({**base, "flag": True}).metrics == {"loss": 0.5}  # no bools
    assert wire.node_of({wire.NODE: "x" * 99}) == "x" * wire.NODE_CHARS
    assert wire.encode({"m": "x" * wire.MAX_DATAGRAM}) is None
