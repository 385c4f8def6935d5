"""Ordinary scripts that know nothing of gpufleet, through the real CLI on 2 CPU workers: an
Accelerate script under a plain `gpufleet run` is really distributed, and layout flags that such
a script will not apply are named before the start (a warning: the job still runs)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from fleet_helpers import EXAMPLES, WORKERS, Fleet

ACCEL = str(WORKERS / "accel_plain.py")
PLAIN_DDP = str(WORKERS / "plain_ddp.py")
RUN_TIMEOUT = 240
RANK_LINE = re.compile(r"rank (\d): num_processes (\d+) batches (\d+)")
DONE_LINE = re.compile(r"rank (\d): reduced ([\d.]+) checksum (-?[\d.]+)")


def warning_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("warning:")]


def rank_logs(fleet: Fleet, job: str) -> dict[int, str]:
    logs = fleet.home / "jobs" / job / "logs"
    return {rank: (logs / f"rank{rank}.log").read_text() for rank in (0, 1)}


def ran(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def test_accelerate_script_under_plain_run_is_distributed(fleet: Fleet) -> None:
    r = fleet("run", ACCEL, "--gpu", "cpu", "--count", "2", "--name", "acc", "-y",
              timeout=RUN_TIMEOUT)
    assert r.returncode == 0, ran(r)
    assert warning_lines(r.stderr) == [], "plain flags on an Accelerate script: nothing to warn"
    logs = rank_logs(fleet, "acc")
    seen = {rank: RANK_LINE.search(text) for rank, text in logs.items()}
    done = {rank: DONE_LINE.search(text) for rank, text in logs.items()}
    for rank in (0, 1):
        start, end = seen[rank], done[rank]
        assert start is not None and end is not None, logs[rank]
        assert int(start[1]) == rank, "each rank is its own process index, not rank 0 twice"
        assert int(start[2]) == 2, f"Accelerate sees one process per rank alone: {start[0]}"
        assert float(end[2]) == 1 + 2, "the ranks' sum is all-reduced over both ranks"
    a, b = seen[0], seen[1]
    assert a is not None and b is not None
    assert int(a[3]) == int(b[3]), "the loader is split evenly between the ranks"
    c0, c1 = done[0], done[1]
    assert c0 is not None and c1 is not None
    # Each rank trained on its own half of the data: equal weights only if gradients averaged.
    assert c0[3] == c1[3], (c0[0], c1[0])
    status = fleet.status("acc")
    assert status["status"] == "succeeded", status
    assert status["world_size"] == 2


def test_fsdp_on_a_plain_ddp_script_is_warned_in_a_dry_run(fleet: Fleet) -> None:
    r = fleet("run", PLAIN_DDP, "--gpu", "cpu", "--count", "2", "--strategy", "fsdp",
              "--dry-run")
    assert r.returncode == 0, ran(r)
    assert warning_lines(r.stderr) == [
        "warning: --strategy fsdp is applied by gpufleet.train.prepare, which plain_ddp.py does "
        "not call: the script runs as written (its own DDP)"]
    assert r.stdout.startswith("# dry run: job plain-ddp-"), r.stdout[:300]
    # A script that calls prepare gets the same flags without a word.
    g = fleet("run", str(EXAMPLES / "gpt.py"), "--gpu", "cpu", "--count", "2",
              "--strategy", "fsdp", "--dry-run")
    assert g.returncode == 0, ran(g)
    assert warning_lines(g.stderr) == []


def test_deepspeed_on_a_plain_ddp_script_is_warned_in_a_dry_run(fleet: Fleet) -> None:
    r = fleet("run", PLAIN_DDP, "--gpu", "cpu", "--count", "2", "--framework", "deepspeed",
              "--dry-run")
    assert r.returncode == 0, ran(r)
    lines = warning_lines(r.stderr)
    assert len(lines) == 1 and "--framework deepspeed" in lines[0], r.stderr
    assert "ds_config.json is not used" in lines[0]


def test_the_warning_comes_before_the_quote_and_the_job_still_runs(fleet: Fleet) -> None:
    r = fleet("run", PLAIN_DDP, "--gpu", "cpu", "--count", "2", "--strategy", "fsdp",
              "--name", "warned", "-y", "--", "--max_steps", "3", timeout=RUN_TIMEOUT)
    assert r.returncode == 0, ran(r)
    lines = r.stderr.splitlines()
    warned = [i for i, ln in enumerate(lines) if ln.startswith("warning: --strategy fsdp")]
    quoted = [i for i, ln in enumerate(lines) if ln.startswith("Quote:")]
    assert len(warned) == 1 and quoted, r.stderr
    assert warned[0] < quoted[0], r.stderr
    assert fleet.status("warned")["status"] == "succeeded"


def test_an_unreadable_script_gets_no_scan(fleet: Fleet, tmp_path: Path) -> None:
    # Not Python text: the checks skip it, the scan says nothing; the dry run still shows it.
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\xff\xfe\x00FSDP(model)\x00")
    r = fleet("run", str(binary), "--gpu", "cpu", "--count", "2", "--strategy", "fsdp",
              "--dry-run")
    assert r.returncode == 0, ran(r)
    assert warning_lines(r.stderr) == []


SHARDED = str(WORKERS / "plain_sharded.py")


def test_a_script_sharding_itself_is_recorded_as_what_it_built(fleet: Fleet) -> None:
    """FSDP2, tensor parallel and both: told apart by the calls the script made, not by its
    DTensor parameters alone (a tensor-parallel model has them too)."""
    want = {"fsdp2": "the script's own FSDP2 (fully_shard)",
            "tp": "the script's own tensor parallel (parallelize_module)",
            "fsdp2+tp": "the script's own FSDP2 with tensor parallel (2-D)"}
    for i, (layout, words) in enumerate(want.items()):
        r = fleet("run", SHARDED, "--gpu", "cpu", "--count", "2", "--name", f"own{i}", "-y", "--",
                  "--layout", layout, timeout=RUN_TIMEOUT)
        assert r.returncode == 0, ran(r)
        s = fleet.status(f"own{i}")
        assert (s["step"], s["layout_seen"]) == (5, f"own:{layout}"), s["layout"]
        assert s["layout"] == f"as written: {words}"


def test_a_script_that_exits_0_without_training_is_not_a_silent_success(fleet: Fleet) -> None:
    r = fleet("run", PLAIN_DDP, "--gpu", "cpu", "--count", "2", "--name", "idle", "-y", "--",
              "--max_steps", "0", timeout=RUN_TIMEOUT)
    assert r.returncode == 0, ran(r)
    s = fleet.status("idle")
    assert s["status"] == "succeeded" and s["step"] is None
    found = {f["rule"]: f for f in s["findings"]}
    assert set(found) == {"no_steps"}, found
    assert found["no_steps"]["severity"] == "warning"
    assert "`gpufleet logs idle`" in found["no_steps"]["fix"]
