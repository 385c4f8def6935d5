"""A durable checkpoint volume that fills up, under the real supervisor: one 2-rank job.

Its `--checkpoint-to` is a small tmpfs of its own (a real filesystem that runs out of space);
the worker fills it before the copies of steps 2, 3 and 6, and frees it before the others.
So the copies fail part-way (ENOSPC), then work again, then fail at the end. Then rank 0 hits
a PermissionError while rank 1 waits for it in a collective. One run, three findings:

- a failed copy leaves no partial folder, later copies still happen, and `status` (text and
  --json), the events and the end of the job say the durable copy is behind, and why;
- local and durable checkpoints are owner-only (0700 folders, 0600 files);
- the diagnosis names rank 0's PermissionError, and says nothing of the interconnect for rank
  1's closed connection.

Without root (no tmpfs), the worker makes the folder read-only instead (no partial folder to
leave then) and locks the last folder by its mode; as root, by the immutable attribute.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_helpers import WORKERS, Fleet

JOB = str(WORKERS / "durable_copy.py")


def _mount_tmpfs(where: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                        str(where)], capture_output=True, text=True, timeout=30)
    return r.returncode == 0


@contextlib.contextmanager
def small_volume(where: Path) -> Iterator[str]:
    """A 1 MiB tmpfs at `where` ("fill": the worker fills it), else a plain folder ("chmod")."""
    where.mkdir()
    if not _mount_tmpfs(where, "1m"):
        if os.geteuid() == 0:
            pytest.skip("root, but tmpfs cannot be mounted: no way to make a copy fail")
        yield "chmod"
        where.chmod(0o700)
        return
    try:
        yield "fill"
    finally:
        subprocess.run(["umount", str(where)], check=False, timeout=30)


@contextlib.contextmanager
def locked_folder(where: Path) -> Iterator[None]:
    """A folder nobody may write into: by its mode, or (root ignores modes) `chattr +i`."""
    where.mkdir()
    if os.geteuid() != 0:
        where.chmod(0o500)
    elif subprocess.run(["chattr", "+i", str(where)], capture_output=True).returncode != 0:
        pytest.skip("root, and chattr +i does not work here: cannot make a folder unwritable")
    try:
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(where)], check=False)
        else:
            where.chmod(0o700)


def owner_only(folder: Path) -> list[str]:
    """What in a checkpoint folder is not owner-only."""
    bad = [] if stat.S_IMODE(folder.stat().st_mode) == 0o700 else [f"{folder}: dir"]
    return bad + [f"{p}: {stat.S_IMODE(p.stat().st_mode):o}" for p in folder.iterdir()
                  if stat.S_IMODE(p.stat().st_mode) != 0o600]


def test_a_full_durable_volume_is_cleaned_up_reported_and_a_rank_error_is_named(
        fleet: Fleet, tmp_path: Path) -> None:
    volume, locked = tmp_path / "volume", tmp_path / "locked"
    with small_volume(volume) as how, locked_folder(locked):
        r = fleet("run", JOB, "--gpu", "cpu", "--count", "2", "--name", "full", "-y",
                  "--checkpoint-to", str(volume), "--", "--steps", "6", "--durable",
                  str(volume), "--blocked", "2,3,6", "--block", how, "--locked", str(locked),
                  timeout=150)
        left = sorted(p.name for p in volume.iterdir() if p.name != "filler.bin")
        durable_modes = [bad for p in volume.glob("step-*") for bad in owner_only(p)]
    status = fleet.status("full")
    out = f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    assert status["status"] == "failed", out  # rank 0's PermissionError ends it

    # finding 7: nothing half-copied left, the later copies made, and the copy behind is told
    assert left == ["step-00000005"], f"{left}\n{out}"  # keep=1
    copies = ("checkpoint_copied", "checkpoint_copy_failed", "checkpoint_copy_behind")
    kinds = [(e["kind"], e["reason"].split(":")[0].split(" copied")[0]) for e in status["events"]
             if e["kind"] in copies]
    assert kinds == [("checkpoint_copied", "step 1"), ("checkpoint_copy_failed", "step 2"),
                     ("checkpoint_copy_failed", "step 3"), ("checkpoint_copied", "step 4"),
                     ("checkpoint_copied", "step 5"), ("checkpoint_copy_failed", "step 6"),
                     ("checkpoint_copy_behind", "the job ended with the durable copy at step 5 "
                      "(behind")], status["events"]
    why = "No space left on device" if how == "fill" else "Permission denied"
    assert status["durable_copy"] == {
        "step": 5, "failed_step": 6, "why": why, "behind": True,
        "text": f"step 5 (behind: step 6 failed: {why})"}
    text = fleet.ok("status", "full").stdout
    assert f"durable copy: step 5 (behind: step 6 failed: {why})" in " ".join(text.split())
    assert "durable copy: step 5 (behind" in " ".join(r.stdout.split()), "said at the end of run"

    # finding 11: owner-only, locally and in the durable copy
    local = sorted((fleet.home / "jobs" / "full" / "checkpoints").glob("step-*"))
    assert [p.name for p in local] == ["step-00000006"]
    assert [bad for p in local for bad in owner_only(p)] == []
    assert durable_modes == []

    # finding 10: the cause is named, its echo is not blamed on the interconnect
    rules = {f["rule"]: f for f in status["findings"]}
    assert "comm_timeout" not in rules, rules["comm_timeout"]
    assert rules["worker_error"]["title"] == "Rank 0 raised PermissionError", rules
    assert str(locked / "done") in rules["worker_error"]["detail"]
