"""backends.fake: a handler's worker events played as a run: lines on a real pipe, datagrams to
the report address, an exit code; a kill ends the run early. And every backend answers the
protocol's questions (lost nodes, where reports go, whether pids are ours) without a process."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from placements import ctx

from gpufleet.backends.base import Backend, Prepared, RunRequest
from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.backends.fake import Exit, FakeBackend, FakeRun, Line, Pause, Send, WorkerEvent
from gpufleet.backends.local import LocalBackend
from gpufleet.backends.ray import RayBackend
from gpufleet.backends.sim import SimBackend, parse_shape
from gpufleet.errors import GpufleetError
from gpufleet.pool.model import Device, Node, Placement
from gpufleet.spec import JobSpec


def _socket() -> tuple[socket.socket, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    host, port = sock.getsockname()
    return sock, f"{host}:{port}"


def test_a_run_plays_lines_datagrams_and_its_exit_code(tmp_path: Path) -> None:
    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield Line(f"[rank0]:run {run.number}")
        yield Send({"rank": 0, "step": 1})
        yield Exit(3)
        yield Line("never")

    sock, addr = _socket()
    backend = FakeBackend(handler)
    handle = backend.start(Prepared(["x"], {}), {"GPUFLEET_REPORT_ADDR": addr}, tmp_path)
    assert handle.stdout is not None
    assert handle.stdout.read() == b"[rank0]:run 1\n"  # the pipe closes at the exit
    assert json.loads(sock.recv(1000)) == {"rank": 0, "step": 1}
    assert handle.wait(5) == 3 and backend.poll(handle) == 3
    assert [r.number for r in backend.starts] == [1]
    sock.close()


def test_a_kill_ends_a_pause_and_reads_as_killed_by_the_signal(tmp_path: Path) -> None:
    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield Pause(60)
        yield Exit(0)

    backend = FakeBackend(handler)
    handle = backend.start(Prepared(["x"], {}), {"GPUFLEET_REPORT_ADDR": "127.0.0.1:9"},
                           tmp_path)
    assert backend.poll(handle) is None
    backend.kill_tree(handle, grace_s=0)
    assert backend.poll(handle) == -signal.SIGTERM


def test_lost_nodes_are_told_once_and_a_lost_node_exit_is_recognised() -> None:
    backend = FakeBackend(lambda run: iter(()), lost={"worker1"})
    assert backend.lost_nodes(Path(".")) == {"worker1"}
    assert backend.lost_nodes(Path(".")) == set()
    lines = ["x", "NodeLostError: node worker1 left", "y"]
    assert backend.node_lost(NODE_LOST_EXIT, lines) == "NodeLostError: node worker1 left"
    assert backend.node_lost(1, lines) is None


def test_every_backend_answers_the_protocol_without_a_process(tmp_path: Path) -> None:
    local: Backend = LocalBackend(cpu_slots=2)
    ray: Backend = RayBackend("p", "127.0.0.1:6379")
    sim: Backend = SimBackend("s", [parse_shape("2xH100:8")])
    assert (local.name, ray.name, sim.name) == ("local", "ray", "sim")
    assert local.pids_here and ray.pids_here and not sim.pids_here  # ray: on loopback
    assert not RayBackend("p", "10.1.2.3:6379").pids_here
    assert local.report_host() == ray.report_host() == "127.0.0.1"
    assert not local.capabilities.multi_node and ray.capabilities.multi_node
    (tmp_path / "ray-plan.lost").write_text('["worker1"]')
    assert ray.lost_nodes(tmp_path) == {"worker1"} and not (tmp_path / "ray-plan.lost").exists()
    assert ray.lost_nodes(tmp_path) == set() and local.lost_nodes(tmp_path) == set()
    assert ray.node_lost(NODE_LOST_EXIT, ["NodeLostError: gone"]) == "NodeLostError: gone"
    assert local.node_lost(NODE_LOST_EXIT, ["NodeLostError: gone"]) is None


def test_prepare_builds_torchrun_here_and_the_driver_plan_on_ray(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    devices = tuple(Device(id=f"gpu{i}", index=i, gpu="H100-SXM", memory_bytes=80 * 10**9,
                           simulated=True) for i in range(2))
    nodes = [Node(id=f"n{k}", address=f"127.0.0.{k + 1}", devices=devices, gpu_fabric="nvswitch",
                  inter_fabric="ethernet", ref=f"ray{k}") for k in range(2)]
    placements = [Placement(n.id, n.address, devices) for n in nodes]
    spec = JobSpec(script="train.py")
    run = RunRequest(spec=spec, layout=spec.layout(4), placements=placements, workers=4,
                     ctx=ctx(), job_dir=tmp_path, run_id="j-2",
                     survive_env={"GPUFLEET_RUN": "2"}, cluster_name="c", cluster_devices=4)
    ray = RayBackend("p", "127.0.0.1:6379")
    monkeypatch.setattr(ray, "discover", lambda: nodes)
    prepared = ray.prepare(run)
    assert prepared.argv[-1] == str(tmp_path / "ray-plan.json")
    plan = json.loads(prepared.files["ray-plan.json"])
    assert [n["name"] for n in plan["nodes"]] == ["head", "worker1"]
    assert plan["nodes"][1]["env"]["GPUFLEET_RUN"] == "2"
    monkeypatch.setattr(ray, "discover", lambda: nodes[:1])
    with pytest.raises(GpufleetError, match=r"node\(s\) n1 of cluster c are not in the Ray cluster"):
        ray.prepare(run)
    one = RunRequest(**{**run.__dict__, "placements": placements[:1], "workers": 1,
                        "layout": spec.layout(1)})
    local = LocalBackend(cpu_slots=2).prepare(one)
    assert local.argv[local.argv.index("--nproc-per-node") + 1] == "1"  # the first `workers`
