"""`bench --out`: refused before any run when it could not be written or would overwrite
something that is not a calibration file; without it, the file goes under the state folder,
where `plan --calibration NAME` finds it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpufleet.errors import SpecError
from gpufleet.measure.command import check_out, default_out, save
from gpufleet.plan.calibration import Calibration, CollectivePoint
from gpufleet.plan.command import calibration_path


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="is a folder"):
        check_out(tmp_path)


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist or is not writable"):
        check_out(tmp_path / "nope" / "cal.json")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_folder_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(SpecError, match="not writable"):
            check_out(tmp_path / "cal.json")
    finally:
        tmp_path.chmod(0o700)


def test_another_json_file_is_not_overwritten(tmp_path: Path) -> None:
    other = tmp_path / "settings.json"
    other.write_text('{"theme": "dark"}')
    with pytest.raises(SpecError, match="not a gpufleet calibration file"):
        check_out(other)
    assert other.read_text() == '{"theme": "dark"}'


def test_a_calibration_file_is_merged(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    point = CollectivePoint("all_reduce", 4, 1.0, 1.0, 1.0)
    first = Calibration(gpu="cpu", network="pcie", collectives=(point,))
    save(path, first)
    check_out(path)  # ours: fine to update
    save(path, Calibration(gpu="cpu", network="pcie", achieved_tflops=0.1))
    data = json.loads(path.read_text())
    assert data["collectives"] and data["achieved_tflops"] == 0.1


def test_without_out_a_bench_writes_under_the_state_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the current folder (a checkout the README's own command would dirty)."""
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    path = default_out("dev")
    assert path == tmp_path / "home" / "calibrations" / "calibration-dev.json"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    check_out(path)  # writable, before the run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_plan_finds_a_saved_calibration_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, here = tmp_path / "home", tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    saved = home / "calibrations" / "calibration-dev.json"
    saved.parent.mkdir(parents=True)
    saved.write_text("{}")
    assert calibration_path("calibration-dev.json", home) == str(saved)
    assert calibration_path("calibration-other.json", home) == "calibration-other.json"  # its own error
    assert calibration_path("sub/calibration-dev.json", home) == "sub/calibration-dev.json"
    (here / "calibration-dev.json").write_text("{}")
    assert calibration_path("calibration-dev.json", home) == "calibration-dev.json"  # here first
