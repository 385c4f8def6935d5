"""Ordinary scripts, unchanged, get progress, loss, ETA, health and an honest layout from the
worker bootstrap: a plain DDP script that never imports gpufleet, under the real CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from pathlib import Path

from fleet_helpers import WORKERS, Fleet, rank_pid

PLAIN = str(WORKERS / "plain_ddp.py")
# 0.1 s a step: 150 steps leave ~14 s after step 8 for `status` to read the live figures (40
# steps once ended first under load, and the ETA read was 0)
STEPS = 150


def test_a_plain_script_shows_steps_loss_eta_and_that_its_layout_is_its_own(fleet: Fleet) -> None:
    fleet.ok("run", "-d", "--gpu", "cpu", "--count", "2", "--name", "plain", "--strategy", "fsdp",
             "-y", PLAIN, "--", "--max_steps", str(STEPS), "--sleep", "0.1", timeout=60)
    live = fleet.wait_for_step("plain", 8)
    assert live["status"] == "running", "the live figures below are read while it runs"
    assert live["total_steps"] == STEPS  # read from the script's own --max_steps
    assert live["eta_s"] is not None and live["eta_s"] > 0
    assert live["samples_per_s"] and live["samples_per_s"] > 0  # DataLoader batches x 2 ranks
    assert live["loss"] is not None  # from its printed "step N: loss X" lines

    s = fleet.wait_ended("plain")
    assert s["status"] == "succeeded", s["reason"]
    assert s["step"] == s["total_steps"] == STEPS
    printed = re.findall(r"loss ([0-9.]+)", (fleet.home / "jobs/plain/logs/rank0.log").read_text())
    assert len(printed) == STEPS
    assert s["loss"] == float(printed[-1]) and s["first_loss"] == float(printed[0])
    # 8 samples per rank per step over 2 ranks; the rate is measured, so only its scale is checked
    assert s["samples"] == STEPS * 16
    # what ran: the script's own DDP; gpufleet's fsdp was never applied, and says so
    assert s["layout_seen"] == "own:ddp"
    assert s["layout"].startswith("as written: the script's own DDP"), s["layout"]
    assert "fsdp" in s["layout"] and "not applied" in s["layout"]
    told = [e["reason"] for e in s["events"] if e["kind"] == "layout"]
    assert len(told) == 1 and "does not call gpufleet.train.prepare" in told[0], told
    assert not any(f["rule"] == "stalled" for f in s["findings"]), s["findings"]


def test_a_stopped_rank_of_a_plain_script_is_found_within_the_hang_timeout(fleet: Fleet) -> None:
    fleet.ok("run", "-d", "--gpu", "cpu", "--count", "2", "--name", "frozen", "--hang-timeout",
             "10s", "-y", PLAIN, "--", "--max_steps", "5000", "--sleep", "0.1", timeout=60)
    fleet.wait_for_step("frozen", 5)
    pid = rank_pid(fleet.home, 1, PLAIN)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        # 10 s of silence, then the next check: about 11 s here; 45 s leaves room for a busy machine
        s = fleet.wait_ended("frozen", timeout=45)
        waited = time.monotonic() - stopped_at
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert s["status"] == "failed"
    assert "rank 1 is stopped" in s["reason"], s["reason"]
    assert waited >= 10, "a hang is declared only after the timeout"
    hang = [e for e in s["events"] if e["kind"] == "hang"]
    assert len(hang) == 1


def test_the_users_sitecustomize_still_runs_and_the_switch_turns_the_bootstrap_off(
        fleet: Fleet, tmp_path: Path) -> None:
    own = tmp_path / "own-site"
    own.mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    (own / "sitecustomize.py").write_text(  # each process marks itself: its rank, PYTHONPATH
        "import json, os\n"
        f"with open(os.path.join({str(marks)!r}, str(os.getpid())), 'w') as f:\n"
        "    json.dump([os.environ.get('RANK'), os.environ.get('PYTHONPATH')], f)\n")
    env = {"PYTHONPATH": f"{own}:{tmp_path / 'second-entry'}"}
    # plain starts: a warm rank is forked after Python's start-up (docs/warm.md)
    r = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "chained", "-y", "--no-warm", PLAIN,
              "--", "--max_steps", "6", timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    s = fleet.status("chained")
    assert s["step"] == 6 and s["layout_seen"] == "own:ddp"
    workers = len(list(marks.iterdir()))
    assert workers >= 3, "the user's sitecustomize ran in torchrun and both workers"
    assert "gpufleet bootstrap" not in r.stderr
    # the dry run shows the PYTHONPATH the workers got: the bootstrap's folder, then the user's
    # own entries in their order
    got = [path for rank, path in (json.loads(m.read_text()) for m in marks.iterdir()) if rank]
    assert len(got) == 2, got  # the two workers
    dry = fleet("run", "--gpu", "cpu", "--count", "2", "--dry-run", PLAIN, "--", "--max_steps", "6",
                env=env)
    assert dry.returncode == 0, dry.stderr[-2000:]
    [shown] = [shlex.split(line)[0].split("=", 1)[1] for line in dry.stdout.splitlines()
               if line.startswith("PYTHONPATH=")]
    assert set(got) == {shown}, (got, shown)
    assert shown.split(":")[1:] == env["PYTHONPATH"].split(":")
    marked = len(list(marks.iterdir()))  # the dry run's own command marked itself too

    r = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "bare", "--no-bootstrap", "-y",
              PLAIN, "--", "--max_steps", "6", timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    s = fleet.status("bare")
    assert s["status"] == "succeeded"
    assert s["step"] is None and s["layout_seen"] is None  # nothing counted its steps
    assert s["loss"] is not None  # the log is still read
    assert s["layout"].endswith("torchrun (requested)"), s["layout"]  # nothing seen, no claim
    assert len(list(marks.iterdir())) >= marked + 3  # the user's own still runs
