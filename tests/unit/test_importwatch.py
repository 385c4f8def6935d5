"""Post-import callbacks: run once the module's code has run, never importing it early."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpufleet.bootstrap import importwatch


@pytest.fixture
def module_dir(tmp_path: Path) -> Path:
    sys.path.insert(0, str(tmp_path))
    yield tmp_path  # type: ignore[misc]
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith("gf_watch_")]:
        del sys.modules[name]


def test_the_callback_runs_after_the_module_and_not_before(module_dir: Path) -> None:
    (module_dir / "gf_watch_a.py").write_text("VALUE = 41\n")
    seen: list[int] = []

    def hook(module: ModuleType) -> None:
        seen.append(module.VALUE)
        module.VALUE += 1

    importwatch.when_imported("gf_watch_a", hook)
    assert "gf_watch_a" not in sys.modules and seen == []
    import gf_watch_a  # type: ignore[import-not-found]

    assert seen == [41] and gf_watch_a.VALUE == 42
    assert gf_watch_a.__spec__.loader is not None
    assert type(gf_watch_a.__spec__.loader).__name__ != "_Loader"  # the real loader again


def test_an_imported_module_gets_its_callback_at_once(module_dir: Path) -> None:
    (module_dir / "gf_watch_b.py").write_text("X = 1\n")
    import gf_watch_b  # type: ignore[import-not-found]  # noqa: F401

    seen: list[str] = []
    importwatch.when_imported("gf_watch_b", lambda m: seen.append(m.__name__))
    assert seen == ["gf_watch_b"]


def test_a_failing_callback_does_not_break_the_import(module_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (module_dir / "gf_watch_c.py").write_text("Y = 2\n")

    def boom(module: ModuleType) -> None:
        raise RuntimeError("hook bug")

    importwatch.when_imported("gf_watch_c", boom)
    import gf_watch_c  # type: ignore[import-not-found]

    assert gf_watch_c.Y == 2
    assert "hook bug" in capsys.readouterr().err


def test_a_failing_callback_on_an_imported_module_is_contained(
        module_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (module_dir / "gf_watch_d.py").write_text("Z = 3\n")
    import gf_watch_d  # type: ignore[import-not-found]  # noqa: F401

    def boom(module: ModuleType) -> None:
        raise RuntimeError("late hook bug")

    importwatch.when_imported("gf_watch_d", boom)  # must not raise into the script
    assert "late hook bug" in capsys.readouterr().err
