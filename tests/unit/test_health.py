"""clusters.health: what `gpufleet list` shows in its HEALTH column, from pure data."""

from __future__ import annotations

from gpufleet.lifecycle.clusters import health
from gpufleet.pool.model import Device, Node, Placement
from gpufleet.store import Cluster


def _cluster(status: str = "running") -> Cluster:
    return Cluster(name="c", gpu="H100-SXM", status=status)


def _dev(i: int, gpu: str = "H100-SXM", healthy: bool = True) -> Device:
    return Device(id=f"gpu{i}", index=i, gpu=gpu, memory_bytes=80 * 2**30, healthy=healthy)


RESERVED = [Placement("n1", "10.0.0.1", (_dev(0), _dev(1)))]


def test_all_devices_present_is_ok() -> None:
    nodes = [Node("n1", "10.0.0.1", (_dev(0), _dev(1), _dev(2)))]
    assert health(_cluster(), RESERVED, nodes) == "ok"


def test_missing_and_unhealthy_devices_are_named() -> None:
    nodes = [Node("n1", "10.0.0.1", (_dev(0, healthy=False),))]
    assert health(_cluster(), RESERVED, nodes) == "degraded: gpu0 unhealthy, gpu1 missing"


def test_device_of_another_type_counts_as_missing() -> None:
    nodes = [Node("n1", "10.0.0.1", (_dev(0), _dev(1, gpu="A100-80GB")))]
    assert health(_cluster(), RESERVED, nodes) == "degraded: gpu1 missing"


def test_lost_and_unhealthy_nodes() -> None:
    assert health(_cluster(), RESERVED, []) == "degraded: node n1 lost"
    sick = [Node("n1", "10.0.0.1", (_dev(0), _dev(1)), healthy=False)]
    assert health(_cluster(), RESERVED, sick) == "degraded: node n1 unhealthy"


def test_stopped_cluster_has_no_health() -> None:
    assert health(_cluster("stopped"), RESERVED, []) == "-"
