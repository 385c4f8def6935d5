"""The bootstrap notes a sharding call wherever the script takes the function from."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from gpufleet.bootstrap import layout_seen


@pytest.fixture
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    """A defining module and a package that re-exported its function before the bootstrap was
    armed, as a warm rank's forkserver imported torch.distributed.fsdp."""
    defining, package = ModuleType("gf_test_defining"), ModuleType("gf_test_package")

    def fully_shard(x: int) -> int:
        return x + 1

    fully_shard.state = "kept"  # type: ignore[attr-defined]
    defining.fully_shard = fully_shard  # type: ignore[attr-defined]
    package.fully_shard = fully_shard  # type: ignore[attr-defined]
    sys.modules.update({defining.__name__: defining, package.__name__: package})
    built = set(layout_seen._BUILT)
    yield defining, package
    for m in (defining, package):
        del sys.modules[m.__name__]
    layout_seen._BUILT.clear()
    layout_seen._BUILT.update(built)


def test_a_call_through_an_earlier_re_export_is_noted(
        modules: tuple[ModuleType, ModuleType]) -> None:
    defining, package = modules
    layout_seen._BUILT.discard("fsdp2")
    layout_seen._on_fully_shard(defining)
    assert package.fully_shard is defining.fully_shard  # type: ignore[attr-defined]
    assert package.fully_shard(1) == 2  # type: ignore[attr-defined]
    assert "fsdp2" in layout_seen._BUILT
    assert package.fully_shard.state == "kept"  # type: ignore[attr-defined]


def test_a_function_of_the_same_name_elsewhere_is_left_alone(
        modules: tuple[ModuleType, ModuleType]) -> None:
    defining, package = modules

    def other(x: int) -> int:
        return x

    package.fully_shard = other  # type: ignore[attr-defined]
    layout_seen._on_fully_shard(defining)
    assert package.fully_shard is other  # type: ignore[attr-defined]
