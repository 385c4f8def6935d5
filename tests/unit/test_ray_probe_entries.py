"""The probe's node entries: a real protobuf node record from Ray's own GCS schema, turned into
the `ray.nodes()` shape that `node_from_ray` reads, without a Ray cluster."""

from __future__ import annotations

import pytest

from gpufleet.backends import ray_probe
from gpufleet.backends.ray import node_from_ray

gcs_pb2 = pytest.importorskip("ray.core.generated.gcs_pb2")
raylet = pytest.importorskip("ray._raylet")


def _info(state: str, labels: dict[str, str]) -> object:
    return gcs_pb2.GcsNodeInfo(
        node_id=bytes(range(28)), node_manager_address="127.0.9.2",
        state=gcs_pb2.GcsNodeInfo.GcsNodeState.Value(state),
        resources_total={"CPU": 2.0, "gpufleet_gpu": 2.0}, labels=labels)


def test_a_live_node_reads_as_ray_nodes_would_list_it() -> None:
    labels = {"gpufleet/gpu": "H100", "gpufleet/node": "worker1", "gpufleet/fabric": "nvswitch"}
    node_id = raylet.NodeID(bytes(range(28)))
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
    entry = ray_probe._node_entry(node_id, _info("ALIVE", labels), alive)
    assert entry == {"NodeID": bytes(range(28)).hex(), "Alive": True,
                     "NodeManagerAddress": "127.0.9.2",
                     "Resources": {"CPU": 2.0, "gpufleet_gpu": 2.0}, "Labels": labels}
    node = node_from_ray(entry)
    assert (node.id, node.address, node.healthy, node.gpu_fabric) == (
        "worker1", "127.0.9.2", True, "nvswitch")
    assert [d.gpu for d in node.devices] == ["H100-SXM", "H100-SXM"]


def test_a_dead_node_is_kept_and_not_alive() -> None:
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
    entry = ray_probe._node_entry(raylet.NodeID(bytes(range(28))),
                                  _info("DEAD", {"gpufleet/node": "head"}), alive)
    assert entry["Alive"] is False
    assert node_from_ray(entry).healthy is False
