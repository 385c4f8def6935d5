"""CPU slots as a user reads them: slots (not GPUs) priced per slot-hour, talking through the
host's shared memory (not PCIe), in the quote, the cluster and pool lists; and a count this host
can never offer refused naming how many it offers and --cpu-slots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from sqlalchemy import select

from gpufleet import slot_words, ui
from gpufleet.errors import SpecError
from gpufleet.lifecycle import clusters
from gpufleet.plan import cost
from gpufleet.pool.model import Device, Node
from gpufleet.spec import ClusterSpec
from gpufleet.store import Cluster, Store


def shown(table: Table) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(table)
    return console.export_text()


def test_a_cpu_quote_is_per_slot_over_shared_memory() -> None:
    text = shown(ui.quote_table("cpu", 2, "pcie", cost.quote("cpu", 2, "pcie"), None))
    assert "Quote: 2 CPU slots over shared memory" in text
    assert "$/slot-hour" in text
    assert "GPU" not in text and "pcie" not in text
    one = shown(ui.quote_table("cpu", 1, "pcie", cost.quote("cpu", 1, "pcie"), None))
    assert "Quote: 1 CPU slot over shared memory" in one


def test_a_gpu_quote_keeps_gpus_and_its_network() -> None:
    text = shown(ui.quote_table("H100-SXM", 8, "nvswitch", cost.quote("H100-SXM", 8, "nvswitch"), None))
    assert "Quote: 8 x H100-SXM over nvswitch" in text
    assert "$/GPU-hour" in text and "slot" not in text


@pytest.mark.parametrize(("gpu", "network", "said"), [
    ("cpu", "pcie", "shared memory"),
    ("cpu", "nvswitch", "shared memory"),  # a node's GPU fabric is not the slots'
    ("cpu", "ethernet", "ethernet"),  # CPU nodes of a pool still have a network between them
    ("H100-SXM", "pcie", "pcie"),
    ("A100-80GB", "infiniband", "infiniband"),
])
def test_network_shown(gpu: str, network: str, said: str) -> None:
    assert slot_words.network_shown(gpu, network) == said


def test_devices_and_unit() -> None:
    assert [slot_words.devices_shown("cpu", n) for n in (1, 3)] == ["1 CPU slot", "3 CPU slots"]
    assert slot_words.devices_shown("A100-80GB", 4) == "4 x A100-80GB"
    assert (slot_words.unit("cpu"), slot_words.unit("T4")) == ("slot", "GPU")


# -------------------------------------------------------- more slots than this host offers


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def host(slots: int) -> list[Node]:
    cpus = tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=2**30) for i in range(slots))
    return [Node(id="local", address="127.0.0.1", devices=cpus, free_disk_bytes=10**12)]


@pytest.mark.parametrize("count", [3, 9, 99])
def test_more_slots_than_the_host_offers_names_count_and_cpu_slots(store: Store, count: int) -> None:
    spec = ClusterSpec.parse({"gpu": "cpu", "count": count})
    with pytest.raises(SpecError) as info:
        clusters.check(store, spec, host(2))
    [(field, msg)] = info.value.problems
    assert field == "count"
    assert msg.startswith(f"{count} CPU slots asked for, but this host offers 2;")
    assert f"--cpu-slots {count}" in msg and "GPUs" not in msg and "--nodes" not in msg
    with pytest.raises(SpecError):
        clusters.launch(store, spec, host(2))
    with store.read() as s:
        assert s.scalars(select(Cluster)).all() == [], "nothing recorded"


def test_a_host_with_enough_slots_takes_more_than_eight(store: Store) -> None:
    spec = ClusterSpec.parse({"gpu": "cpu", "count": 12, "name": "wide"})
    c = clusters.launch(store, spec, host(12))
    assert (c.count, c.nodes) == (12, 1)
    assert [len(p.devices) for p in clusters.placements(store, c)] == [12]
