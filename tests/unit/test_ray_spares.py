"""A Ray run's spares warmed and let go (backends/ray_spares.py), against a scripted Ray whose
agents are real `ShippingAgent`s on this machine's own workdir cache (a temporary HOME): what
the warm line says, what the spare's cache holds, and what `release` leaves."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends import node_workdir
from gpufleet.backends.node_ship import ShippingAgent
from gpufleet.backends.ray_spares import Spares

DIGEST = "ab" * 32


class _Ref:
    def __init__(self, call: Callable[[], Any]):
        self.call = call


class _Method:
    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def remote(self, *args: Any) -> _Ref:
        return _Ref(lambda: self.fn(*(a.call() if isinstance(a, _Ref) else a for a in args)))


class _Actor:
    """An actor handle: each method's `.remote` runs the real agent's method when got."""

    def __init__(self, agent: ShippingAgent):
        self.agent = agent

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self.agent, name))


class _AgentCls:
    def __init__(self, placeable: bool = True):
        self.placeable = placeable
        self.options_seen: list[dict[str, Any]] = []
        self.made: list[_Actor] = []

    def options(self, **kw: Any) -> _AgentCls:
        self.options_seen.append(kw)
        return self

    def remote(self, node: str, report_addr: str) -> _Actor:
        if not self.placeable:
            raise RuntimeError("node affinity: node is dead")
        actor = _Actor(ShippingAgent(node, report_addr))
        self.made.append(actor)
        return actor


class _Ray:
    def __init__(self) -> None:
        self.puts = 0
        self.killed: list[Any] = []

    def put(self, value: Any) -> _Ref:
        self.puts += 1
        return _Ref(lambda: value)

    def get(self, ref: _Ref, timeout: float | None = None) -> Any:
        return ref.call()

    def wait(self, refs: list[_Ref], num_returns: int = 1, timeout: float | None = None
             ) -> tuple[list[Any], list[Any]]:
        return [r.call() for r in refs], []

    def kill(self, actor: Any) -> None:
        self.killed.append(actor)


def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(node_workdir.CACHE_ENV, raising=False)
    yield node_workdir.cache_root()


def _warmed(ray: _Ray, cls: _AgentCls, setup: str) -> tuple[Spares, list[str]]:
    """One spare warmed for job `gm`, waited for; the lines it said."""
    said: list[str] = []
    spares = Spares(ray, cls, [{"node_id": "m3", "ray_id": "ab" * 28, "address": "10.0.0.7"}],
                    "gm", "127.0.0.1:9", said.append)
    spares.warm(DIGEST, _tar(), setup)
    assert spares.thread is not None
    spares.thread.join(timeout=60)
    return spares, said


def test_a_spare_gets_the_copy_and_its_setup_and_keeps_it_until_released(cache: Path) -> None:
    ray, cls = _Ray(), _AgentCls()
    spares, said = _warmed(ray, cls, "touch set-up-here")
    assert len(said) == 1 and said[0].startswith("spare m3 (10.0.0.7) warm in "), said
    assert said[0].endswith(f"workdir {DIGEST[:12]} shipped, setup ran"), said
    assert (cls.options_seen[0]["num_cpus"], "num_gpus" in cls.options_seen[0]) == (0, False)
    assert (cache / DIGEST / "train.py").is_file() and (cache / DIGEST / "set-up-here").exists()
    # a run's own mark going leaves the copy: the job's mark holds it
    assert node_workdir.remove(cache, DIGEST, "gm-1234") is False
    spares.release()
    assert not (cache / DIGEST).exists()
    spares.close()
    assert ray.killed == cls.made


def test_a_spare_that_has_the_copy_is_sent_nothing(cache: Path) -> None:
    node_workdir.place(cache, DIGEST, io.BytesIO(_tar()), "touch set-up-here", lambda _: None,
                       user="gm-1")
    ray, cls = _Ray(), _AgentCls()
    _, said = _warmed(ray, cls, "touch set-up-here")
    assert ray.puts == 0, "the tar went to the object store for a spare that had the copy"
    assert said[0].endswith("0 bytes shipped (it had the copy), setup done before"), said


def test_a_spare_ray_cannot_place_is_named_not_warmed_and_the_run_goes_on(cache: Path) -> None:
    ray, cls = _Ray(), _AgentCls(placeable=False)
    spares, said = _warmed(ray, cls, "")
    assert said == ["spare m3 (10.0.0.7) not warmed: RuntimeError: node affinity: node is dead"]
    assert not (cache / DIGEST).exists()
    spares.release()  # nothing placed: nothing to let go, no error
