"""`bench --out`: refused before any run when it could not be written or would overwrite
something that is not a calibration file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpufleet.errors import SpecError
from gpufleet.measure.command import check_out, save
from gpufleet.plan.calibration import Calibration, CollectivePoint


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
