"""The durable copy on real files: a failed copy cleans up after itself, later copies still
happen, checkpoints are owner-only unless shared, and the job's events tell where it stands."""

from __future__ import annotations

import contextlib
import os
import resource
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import durable_copy
from gpufleet.supervise.notes import note_of
from gpufleet.train import ckpt_files as files
from gpufleet.train import ckpt_modes
from gpufleet.train.ckpt_copy import DurableCopier, reason_of


def local_checkpoint(root: Path, step: int, size: int = 64 * 1024) -> Path:
    """A complete local checkpoint of one rank: a data file of `size` bytes and its sums."""
    folder = root / files.folder_name(step)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(os.urandom(size))
    (folder / ".metadata").write_bytes(b"m" * 100)
    files.write_sums(folder, 0, ["__0_0.distcp"])
    files.write_manifest(folder, step, world_size=1, extra={})
    return folder


def copier(durable_root: Path, said: list[str], keep: int = 2,
           private: bool = True) -> DurableCopier:
    return DurableCopier(str(durable_root), rank=0, world=1, local_world=1, node=0, keep=keep,
                         private=private, log=said.append)


@contextlib.contextmanager
def file_size_limit(limit_bytes: int) -> Iterator[None]:
    """RLIMIT_FSIZE for this process: a write past the limit fails with EFBIG ("File too
    large"), as a full volume fails with ENOSPC (Python ignores SIGXFSZ, so it is an OSError).
    A real limit on real writes, lifted afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def modes(path: Path) -> tuple[int, list[int]]:
    return (stat.S_IMODE(path.stat().st_mode),
            sorted({stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()}))


def test_a_failed_copy_removes_its_partial_folder_and_the_next_copy_still_happens(
        tmp_path: Path) -> None:
    local, out, said = tmp_path / "local", tmp_path / "durable", []
    c = copier(out, said)
    assert c.copy(local_checkpoint(local, 10), 10)
    twenty = local_checkpoint(local, 20)
    with file_size_limit(16 * 1024):  # its 64 KiB data file cannot be copied
        assert not c.copy(twenty, 20)
    assert [p.name for p in out.iterdir()] == ["step-00000010"], \
        "no step-00000020.partial left to hold the space the next copy needs"
    assert "step-00000020" in said[-1] and "File too large" in said[-1]
    assert c.copy(local_checkpoint(local, 30), 30)
    assert [s for s, _ in files.complete(out)] == [30, 10]
    assert files.check(out / "step-00000030").ok


def test_a_copy_prunes_to_keep_minus_one_first_so_it_needs_room_for_keep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local, out, said = tmp_path / "local", tmp_path / "durable", []
    c = copier(out, said, keep=2)
    for step in (1, 2):
        assert c.copy(local_checkpoint(local, step), step)
    (out / "step-00000001.partial").mkdir()  # left by a copy that was killed mid-way
    seen: list[list[str]] = []
    real_copy_out = files.copy_out

    def watching(src: Path, dest: str, names: list[str], private: bool = True) -> None:
        """What the durable folder holds when a copy starts."""
        seen.append(sorted(p.name for p in out.iterdir()))
        real_copy_out(src, dest, names, private)

    source = local_checkpoint(local, 3)
    monkeypatch.setattr(files, "copy_out", watching)  # a look at the folder, the real copy
    assert c.copy(source, 3)
    assert seen[0] == ["step-00000002"], "the oldest beyond keep-1, and the stale partial, went"
    assert [s for s, _ in files.complete(out)] == [3, 2]


def test_copies_and_local_folders_are_owner_only_unless_shared(tmp_path: Path) -> None:
    local, said = tmp_path / "local", []
    old = os.umask(0o022)
    try:
        source = local_checkpoint(local, 5)
        ckpt_modes.restrict(source, private=True)
        assert modes(source) == (0o700, [0o600])
        assert copier(tmp_path / "new" / "durable", said).copy(source, 5)
        copied = tmp_path / "new" / "durable" / "step-00000005"
        assert modes(copied) == (0o700, [0o600])
        assert stat.S_IMODE((tmp_path / "new" / "durable").stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700, "made here: private"
        assert copier(tmp_path / "shared", said, private=False).copy(source, 5)
        assert modes(tmp_path / "shared" / "step-00000005") == (0o755, [0o644])
    finally:
        os.umask(old)


def test_an_existing_durable_root_keeps_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "team"
    root.mkdir()
    root.chmod(0o755)
    assert copier(root, []).copy(local_checkpoint(tmp_path / "local", 1), 1)
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "step-00000001").stat().st_mode) == 0o700


@pytest.mark.parametrize(("arg", "env", "shared"), [
    (None, {}, False), (None, {"GPUFLEET_CHECKPOINT_SHARED": "1"}, True),
    (None, {"GPUFLEET_CHECKPOINT_SHARED": "no"}, False),
    (False, {"GPUFLEET_CHECKPOINT_SHARED": "1"}, False), (True, {}, True)])
def test_shared_comes_from_the_argument_else_the_environment(
        arg: bool | None, env: dict[str, str], shared: bool) -> None:
    assert ckpt_modes.shared_from(arg, env) is shared


def test_a_bad_shared_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="GPUFLEET_CHECKPOINT_SHARED: got 'maybe'; use 1"):
        ckpt_modes.shared_from(None, {"GPUFLEET_CHECKPOINT_SHARED": "maybe"})


def test_why_a_copy_failed_is_said_in_the_os_words() -> None:
    assert reason_of(OSError(28, "No space left on device", "/v/x")) == "No space left on device"
    assert reason_of(TimeoutError("node(s) [1] did not finish")) == \
        "TimeoutError: node(s) [1] did not finish"


# --- the job's events -------------------------------------------------------------------------

def events(*notes: dict[str, object]) -> list[tuple[str, str]]:
    """The (kind, reason) events the supervisor records for these Checkpointer notes."""
    out = []
    for n in notes:
        _, record = note_of({"rank": 0, **n})
        assert record is not None
        out.append((record.kind, record.text))
    return out


COPIED = {"event": "checkpoint_copied", "path": "/vol/ckpt/step"}
FULL = {"event": "checkpoint_copy_failed", "why": "No space left on device"}


def test_the_durable_copy_is_behind_after_a_failed_copy_until_a_later_one_works() -> None:
    behind = events({**COPIED, "step": 10}, {**COPIED, "step": 20}, {**FULL, "step": 30})
    copy = durable_copy.state([("checkpoint", "step 30 saved"), *behind])
    assert copy is not None and copy.behind
    assert copy.text == "step 20 (behind: step 30 failed: No space left on device)"
    assert copy.as_dict() == {"step": 20, "failed_step": 30, "why": "No space left on device",
                              "behind": True, "text": copy.text}
    caught_up = durable_copy.state([*behind, *events({**FULL, "step": 40}, {**COPIED, "step": 50})])
    assert caught_up == durable_copy.DurableCopy(50) and caught_up.text == "step 50"
    assert durable_copy.state(events({**FULL, "step": 10})) == \
        durable_copy.DurableCopy(None, 10, "No space left on device")


def test_no_copy_events_means_no_durable_copy_to_speak_of() -> None:
    assert durable_copy.state([("checkpoint", "step 10 saved"), ("resumed", "from step 10")]) is None
    assert durable_copy.of_rows([]) is None


def test_restrict_after_rank_0_renamed_the_partial_folder_on_shared_storage(tmp_path: Path) -> None:
    """Nodes sharing one file system (NFS, or a Ray pool on one host): another node's first rank
    restricts a partial folder rank 0 has already made final; that is not an error."""
    ckpt_modes.restrict(tmp_path / "step-00000005.partial", private=True)  # gone: no raise
