"""train.ckpt_files on real files: names, manifests, checksums, pruning, turns and copies."""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from gpufleet.train import ckpt_files as files

# rank 0 writes model.pt and optim-0.pt, rank 1 writes optim-1.pt; sorted data files are
# [model.pt, optim-0.pt, optim-1.pt], so share (0, 2) hashes model.pt and optim-1.pt and
# share (1, 2) hashes optim-0.pt
RANK_FILES = {0: {"model.pt": b"model weights " * 50, "optim-0.pt": b"optimizer zero " * 40},
              1: {"optim-1.pt": b"optimizer one " * 30}}


def make_checkpoint(root: Path, step: int, *, manifest: bool = True, suffix: str = "") -> Path:
    folder = root / (files.folder_name(step) + suffix)
    folder.mkdir(parents=True)
    for rank, written in RANK_FILES.items():
        for name, data in written.items():
            (folder / name).write_bytes(data)
        files.write_sums(folder, rank, written)
    if manifest:
        files.write_manifest(folder, step, world_size=2, extra={"note": "test"})
    return folder


def flip_byte(path: Path, at: int = 3) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- names


def test_folder_name_and_step_of_round_trip() -> None:
    assert files.folder_name(50) == "step-00000050"
    assert files.folder_name(123_456_789) == "step-123456789"
    for step in (0, 50, 99_999_999, 123_456_789):
        assert files.step_of(files.folder_name(step)) == step


@pytest.mark.parametrize("name", ["step-50", "step-00000050.partial", "x-step-00000050", "manifest.json",
                                  "step-0000005a"])
def test_step_of_rejects_other_names(name: str) -> None:
    assert files.step_of(name) is None


def test_is_url() -> None:
    assert files.is_url("s3://bucket/ckpt")
    assert files.is_url("memory://x")
    assert not files.is_url("/data/ckpt")


# ---------------------------------------------------------------- write + check


def test_written_checkpoint_checks_ok(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50)
    assert files.check(folder) == files.Verdict(True)
    manifest = files.manifest_of(folder)
    assert manifest is not None
    assert (manifest["step"], manifest["world_size"], manifest["note"]) == (50, 2, "test")
    assert manifest["files"] == {
        "model.pt": 700, "optim-0.pt": 600, "optim-1.pt": 420,
        "sums-rank0.json": (folder / "sums-rank0.json").stat().st_size,
        "sums-rank1.json": (folder / "sums-rank1.json").stat().st_size,
    }
    sums = json.loads((folder / "sums-rank1.json").read_text())
    assert set(sums) == {"optim-1.pt"}
    assert sums["optim-1.pt"]["size"] == 420


def test_manifest_leaves_out_turn_markers(tmp_path: Path) -> None:
    folder = tmp_path / files.folder_name(1)
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"x")
    files.write_sums(folder, 0, ["model.pt"])
    files.done_turn(folder, 0)
    files.write_manifest(folder, 1, 1, {})
    manifest = files.manifest_of(folder)
    assert manifest is not None
    assert set(manifest["files"]) == {"model.pt", "sums-rank0.json"}
    assert files.check(folder).ok


def test_check_fails_without_manifest(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50, manifest=False)
    verdict = files.check(folder)
    assert not verdict.ok
    assert "no manifest" in verdict.why


def test_check_fails_with_an_unreadable_manifest(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50)
    (folder / files.MANIFEST).write_text("{not json")
    assert "no manifest" in files.check(folder).why


def test_check_fails_when_a_file_is_missing(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50)
    (folder / "optim-1.pt").unlink()
    assert files.check(folder) == files.Verdict(False, "optim-1.pt is missing")


def test_check_fails_when_a_file_is_truncated(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50)
    path = folder / "model.pt"
    path.write_bytes(path.read_bytes()[:100])
    assert files.check(folder) == files.Verdict(False, "model.pt has 100 bytes, the manifest says 700")


def test_check_fails_on_a_flipped_byte(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50)
    flip_byte(folder / "optim-0.pt")
    assert files.check(folder) == files.Verdict(False, "checksum mismatch in optim-0.pt")


def test_check_fails_for_a_data_file_no_rank_summed(tmp_path: Path) -> None:
    folder = tmp_path / files.folder_name(7)
    folder.mkdir()
    (folder / "a.pt").write_bytes(b"aaa")
    (folder / "b.pt").write_bytes(b"bbb")
    files.write_sums(folder, 0, ["a.pt"])
    files.write_manifest(folder, 7, 1, {})
    assert files.check(folder) == files.Verdict(False, "no checksum for b.pt")


def test_dcp_metadata_file_needs_no_checksum(tmp_path: Path) -> None:
    folder = tmp_path / files.folder_name(7)
    folder.mkdir()
    (folder / "a.pt").write_bytes(b"aaa")
    (folder / ".metadata").write_bytes(b"meta")
    files.write_sums(folder, 0, ["a.pt"])
    files.write_manifest(folder, 7, 1, {})
    assert files.check(folder).ok


def test_check_fails_on_an_unreadable_sums_file(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50)
    path = folder / "sums-rank1.json"
    path.write_bytes(b"!" * path.stat().st_size)  # same size, not JSON
    assert files.check(folder) == files.Verdict(False, "sums-rank1.json is unreadable")


def test_check_hashes_only_its_share(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50)
    flip_byte(folder / "optim-0.pt")  # data index 1: share (1, 2)
    assert files.check(folder, share=(0, 2)).ok
    assert files.check(folder, share=(1, 2)) == files.Verdict(False, "checksum mismatch in optim-0.pt")
    assert not files.check(folder).ok


def test_every_share_checks_sizes(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 50)
    path = folder / "optim-0.pt"
    path.write_bytes(path.read_bytes() + b"more")
    assert "optim-0.pt has 604 bytes" in files.check(folder, share=(0, 2)).why


# ---------------------------------------------------------------- complete / prune


def test_complete_lists_newest_first_and_skips_folders_without_manifest(tmp_path: Path) -> None:
    for step in (20, 100, 5):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 200, manifest=False)
    make_checkpoint(tmp_path, 300, suffix=files.PARTIAL)
    (tmp_path / "notes").mkdir()
    (tmp_path / "step-00000400").write_text("a file, not a folder")
    assert files.complete(tmp_path) == [(100, tmp_path / "step-00000100"),
                                        (20, tmp_path / "step-00000020"),
                                        (5, tmp_path / "step-00000005")]


def test_complete_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    assert files.complete(tmp_path / "nope") == []


def test_prune_keeps_the_newest_and_drops_stale_partials(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        make_checkpoint(tmp_path, step)
    stale = make_checkpoint(tmp_path, 25, manifest=False, suffix=files.PARTIAL)
    writing = make_checkpoint(tmp_path, 50, manifest=False, suffix=files.PARTIAL)
    (tmp_path / "notes").mkdir()
    gone = files.prune(tmp_path, keep=2)
    assert set(gone) == {tmp_path / "step-00000010", tmp_path / "step-00000020", stale}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes", "step-00000030", "step-00000040", writing.name]


def test_prune_on_a_node_with_only_partial_folders_keeps_the_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        make_checkpoint(tmp_path, step, manifest=False, suffix=files.PARTIAL)
    gone = files.prune(tmp_path, keep=2)
    assert gone == [tmp_path / "step-00000010.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000020.partial",
                                                           "step-00000030.partial"]


def test_prune_with_fewer_than_keep_deletes_nothing(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    assert files.prune(tmp_path, keep=3) == []
    assert (tmp_path / "step-00000010").is_dir()


def test_prune_of_a_missing_root(tmp_path: Path) -> None:
    assert files.prune(tmp_path / "nope", keep=1) == []


# ---------------------------------------------------------------- turns


def test_wave_before() -> None:
    assert [list(files.wave_before(i, 2)) for i in range(6)] == [[], [], [0, 1], [0, 1],
                                                                [2, 3], [2, 3]]
    assert [list(files.wave_before(i, 1)) for i in range(3)] == [[], [0], [1]]
    assert list(files.wave_before(7, 4)) == [0, 1, 2, 3]
    assert list(files.wave_before(3, 4)) == []


def test_wait_for_returns_true_once_markers_exist(tmp_path: Path) -> None:
    files.done_turn(tmp_path, 0)
    files.done_turn(tmp_path, 1)
    assert files.turn_marker(tmp_path, 1) == tmp_path / ".turn-1"
    assert files.wait_for(tmp_path, [0, 1], timeout_s=5.0)
    assert files.wait_for(tmp_path, [], timeout_s=0.0)


def test_wait_for_sees_a_marker_written_while_waiting(tmp_path: Path) -> None:
    timer = threading.Timer(0.05, files.done_turn, args=(tmp_path, 3))
    timer.start()
    try:
        assert files.wait_for(tmp_path, [3], timeout_s=5.0)
    finally:
        timer.cancel()


def test_wait_for_times_out(tmp_path: Path) -> None:
    files.done_turn(tmp_path, 0)
    start = time.monotonic()
    assert not files.wait_for(tmp_path, [0, 1], timeout_s=0.1)
    assert 0.1 <= time.monotonic() - start < 2.0


# ---------------------------------------------------------------- copies


def all_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_copy_out_to_a_plain_folder(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "local", 50)
    dest = tmp_path / "durable" / "deep" / src.name
    names = [n for n in all_names(src) if n != files.MANIFEST]
    files.copy_out(src, str(dest), names)
    assert not files.check(dest).ok  # no manifest yet
    files.copy_out(src, str(dest), [files.MANIFEST])
    assert files.check(dest).ok
    assert all_names(dest) == all_names(src)
    assert (dest / "model.pt").read_bytes() == (src / "model.pt").read_bytes()


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A unique memory:// location, removed afterwards."""
    path = f"/gpufleet-test-{uuid.uuid4().hex}"
    yield f"memory://{path}"
    fs = fsspec.filesystem("memory")
    if fs.exists(path):
        fs.rm(path, recursive=True)


def test_copy_to_a_url_then_list_fetch_and_prune(tmp_path: Path, memory_root: str) -> None:
    local = tmp_path / "local"
    for step in (10, 20, 30):
        src = make_checkpoint(local, step)
        files.copy_out(src, f"{memory_root}/{src.name}", all_names(src))
    unfinished = make_checkpoint(local, 40, manifest=False)
    files.copy_out(unfinished, f"{memory_root}/{unfinished.name}", all_names(unfinished))

    assert files.remote_complete(memory_root) == [(30, "step-00000030"), (20, "step-00000020"),
                                                  (10, "step-00000010")]
    assert files.remote_complete(memory_root + "/") == files.remote_complete(memory_root)

    dest = tmp_path / "fetched" / "step-00000020.partial"
    files.fetch(memory_root, "step-00000020", dest)
    assert files.check(dest).ok
    assert all_names(dest) == all_names(local / "step-00000020")
    assert (dest / "optim-1.pt").read_bytes() == RANK_FILES[1]["optim-1.pt"]

    files.remote_prune(memory_root, keep=1)
    assert files.remote_complete(memory_root) == [(30, "step-00000030")]
    fs, root = fsspec.core.url_to_fs(memory_root)
    left = sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    assert left == ["step-00000030", "step-00000040"]  # a copy without manifest is not pruned


def test_fetched_damage_is_caught_by_check(tmp_path: Path, memory_root: str) -> None:
    src = make_checkpoint(tmp_path / "local", 10)
    files.copy_out(src, f"{memory_root}/{src.name}", all_names(src))
    shutil.rmtree(src)
    fs, root = fsspec.core.url_to_fs(memory_root)
    data = bytearray(fs.cat_file(f"{root}/step-00000010/model.pt"))
    data[0] ^= 0xFF
    fs.pipe_file(f"{root}/step-00000010/model.pt", bytes(data))
    dest = tmp_path / "fetched"
    files.fetch(memory_root, "step-00000010", dest)
    assert files.check(dest) == files.Verdict(False, "checksum mismatch in model.pt")


def test_remote_complete_of_a_missing_location_is_empty(memory_root: str) -> None:
    assert files.remote_complete(memory_root) == []


def test_prune_spares_protected_folders(tmp_path: Path) -> None:
    """A checkpoint still being copied to durable storage is not deleted under the copier."""
    for step in (1, 2, 3):
        folder = tmp_path / files.folder_name(step)
        folder.mkdir()
        (folder / "data").write_bytes(b"x")
        files.write_manifest(folder, step, 1, {})
    oldest = tmp_path / files.folder_name(1)
    gone = files.prune(tmp_path, keep=1, protect={oldest})
    assert gone == [tmp_path / files.folder_name(2)]
    assert oldest.is_dir()
