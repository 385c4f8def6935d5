"""Submission asks the cluster's engine whether its nodes see this machine's files, through
lifecycle's own path against a real SQLite store: a job whose checkpoints would be read back
on other nodes is refused before it starts, and the cluster made for it is given back."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from test_toy_engine import TOY, ToyEngine, _add

from gpufleet.backends import kinds, registry, shipping
from gpufleet.errors import SpecError
from gpufleet.lifecycle import engine_alloc, pool_setup, provision, submit
from gpufleet.spec import JobSpec
from gpufleet.store import Store


class SharingToy(ToyEngine):
    """The toy engine whose nodes in `mounted` read this machine's files."""

    def __init__(self, names: list[str], mounted: set[str]):
        super().__init__(names)
        self.mounted = mounted
        self.probes: list[tuple[list[str], str]] = []

    def sees(self, node_ids: Sequence[str], path: Path, content: str,
             ref: str = "") -> dict[str, bool]:
        self.probes.append((list(node_ids), ref))
        return {n: n in self.mounted and path.read_text() == content for n in node_ids}


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SharingToy]:
    engine = SharingToy(["n1", "n2", "n3"], mounted={"n1"})
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(kinds.CAPABILITIES, "toy", TOY)
    monkeypatch.setitem(registry.ENGINES, "toy", registry.Engine(
        lambda _o: engine, lambda _a, s: f"toy region {s['region']}", _add))
    monkeypatch.setattr(engine_alloc.time, "sleep", lambda _s: None)
    yield engine


def _job(store: Store, **fields: object) -> JobSpec:
    cluster = provision.with_pool(store, {"gpu": "H100", "count": 4, "nodes": 2,
                                          "network": "infiniband"})
    return JobSpec.parse({"script": "train.py", "cluster": cluster, "workdir": "/tmp",
                          **fields})


def test_restarts_on_nodes_that_do_not_share_are_refused_and_leave_nothing(
        toy: SharingToy, tmp_path: Path) -> None:
    store = Store(url=f"sqlite:///{tmp_path}/s.db")
    pool_setup.add(store, "toy", "p", None, [], None, True)
    assert isinstance(toy, shipping.SharesFiles)
    with pytest.raises(SpecError) as err:
        submit.submit(store, _job(store, name="j", max_restarts=2), None)
    assert str(err.value).startswith("checkpoint_to: node(s) n2 of cluster ")
    assert toy.probes == [(["n1", "n2"], "t1")]  # asked once, within the allocation
    assert toy.cancelled == ["t1"] and toy.held == {}  # the cluster made for it given back
    assert list((tmp_path / "home" / "jobs").iterdir()) == []  # the probe file removed

