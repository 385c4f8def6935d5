"""Surviving failures and resizing, with real gloo workers under the real CLI.

Every job here runs workers/survive.py: a deterministic DDP regression whose rank 0 appends each
step's loss to a file (across restarts) and saves the final weights. A reference run of the same
script under bare torchrun, never interrupted, gives the weights and losses a recovered job must
reproduce.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from fleet_helpers import WORKERS, Fleet, rank_pid, wait_no_leftovers

SURVIVE = str(WORKERS / "survive.py")
STEPS = 30
# A test that kills something once step 12 is seen needs the job still running when the kill
# lands: the kill tests park the workers after step 12 until a gate file appears (--wait-at,
# --gate), made once the kill is done, so no load can end the job first. The hang test cannot
# park silently (a parked rank is silent: the hang would be found before the SIGSTOP, as it
# was at a load average of 30): its first run beats at step 10 (an all-reduce and a report
# every 0.3 s, --hold-at) until the hang ends it; it once ran a fixed 60 steps, which left
# 12 s after step 8 to find rank 1 (30 steps once ended first).
KILL_STEP_SLEEP_S = 0.3
# The hang test's timeout: far above a step's time under load (with 3 s the job ended failed,
# not recovered, at a load average of 30, where seconds between two reports are ordinary)
HANG_S = 10
HANG_STEPS, HANG_SLOW_STEPS = 60, 50


def reference(tmp: Path, steps: int = STEPS, workers: int = 2) -> tuple[dict[str, Any], list[float]]:
    """Final weights and per-step losses of an uninterrupted run under bare torchrun."""
    tmp.mkdir(parents=True, exist_ok=True)
    losses, out = tmp / "ref.jsonl", tmp / "ref.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["GPUFLEET_CHECKPOINT_DIR"] = str(tmp / "ref-checkpoints")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(workers), SURVIVE, "--steps", str(steps),
                    "--losses", str(losses), "--out", str(out)],
                   env=env, cwd=tmp, check=True, capture_output=True, timeout=120)
    return torch.load(out), [r["loss"] for r in read_losses(losses)]


@pytest.fixture(scope="module")
def ref30(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[float]]:
    """The uninterrupted 30-step, 2-worker run the kill and resume tests compare against."""
    return reference(tmp_path_factory.mktemp("ref30"))


def read_losses(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_done(fleet: Fleet, job: str, timeout: float = 120) -> dict[str, Any]:
    return fleet.wait_ended(job, timeout)


def kinds(status: dict[str, Any]) -> list[str]:
    return [e["kind"] for e in status["events"]]


def reason_of(status: dict[str, Any], kind: str) -> str:
    return next(e["reason"] for e in status["events"] if e["kind"] == kind)


def same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_killed_rank_restarts_from_checkpoint_with_identical_weights(
        fleet: Fleet, tmp_path: Path, ref30: tuple[dict[str, Any], list[float]]) -> None:
    ref_weights, ref_losses = ref30
    losses, out = tmp_path / "losses.jsonl", tmp_path / "out.pt"
    fleet.ok("run", "-d", "--gpu", "cpu", "--count", "2", "--name", "k9", "-y",
             "--max-restarts", "2", SURVIVE, "--", "--steps", str(STEPS), "--every", "5",
             "--async-save", "--step-sleep", str(KILL_STEP_SLEEP_S), "--slow-until", "1000",
             "--wait-at", "12", "--gate", str(tmp_path / "go"),
             "--losses", str(losses), "--out", str(out))
    fleet.wait_for_step("k9", 12)
    os.kill(rank_pid(fleet.home, 1, SURVIVE), signal.SIGKILL)  # kill -9 mid-training
    (tmp_path / "go").touch()
    s = wait_done(fleet, "k9")
    assert s["status"] == "succeeded", s
    assert s["step"] == STEPS
    assert same_weights(torch.load(out), ref_weights), "weights differ from an uninterrupted run"
    failed = reason_of(s, "worker_failed")
    assert "rank 1" in failed and "SIGKILL" in failed
    restart = reason_of(s, "restarting")
    assert "from gpufleet's checkpoint at step" in restart and "redone" in restart
    assert "resumed" in kinds(s)
    rows = read_losses(losses)
    redone = [r for r in rows if sum(1 for o in rows if o["step"] == r["step"]) > 1]
    assert redone, "the steps after the checkpoint were run again"
    final = {r["step"]: r["loss"] for r in rows}  # the last value of each step wins
    assert [final[i] for i in range(1, STEPS + 1)] == ref_losses


def test_stopped_rank_is_found_by_hang_timeout_and_the_job_recovers(fleet: Fleet) -> None:
    fleet.ok("run", "-d", "--gpu", "cpu", "--count", "2", "--name", "hung", "-y",
             "--max-restarts", "1", "--hang-timeout", f"{HANG_S}s", SURVIVE, "--",
             "--steps", str(HANG_STEPS), "--every", "5", "--step-sleep", str(KILL_STEP_SLEEP_S),
             "--slow-until", str(HANG_SLOW_STEPS), "--hold-at", "10",
             "--losses", str(fleet.cwd / "losses.jsonl"))
    # the first run beats at step 10 until the hang ends it (survive.py --hold-at): its own
    # end can never come before the SIGSTOP
    fleet.wait_for_step("hung", 8)
    pid = rank_pid(fleet.home, 1, SURVIVE)
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    s = wait_done(fleet, "hung", timeout=300)
    assert s["status"] == "succeeded", s
    assert s["step"] == HANG_STEPS
    hang = next(e for e in s["events"] if e["kind"] == "hang")
    assert "rank 1 is stopped" in hang["reason"]
    # The clock starts at the last report, up to a step before the SIGSTOP (0.3 s idle, seconds
    # under load) or just after it, so a bound on the time since the SIGSTOP would judge the
    # load. The supervisor's own record says how long no rank had reported when it called the
    # hang: the timeout, not less, and not a multiple of it.
    said = re.search(r"no rank reported for (\d+) s", hang["reason"])
    assert said and HANG_S <= int(said[1]) < HANG_S * 3, hang["reason"]
    assert hang["time"] > stopped_at, "a hang found before the SIGSTOP was no hang"


def test_killed_supervisor_leaves_nothing_and_resume_skips_a_corrupt_checkpoint(
        fleet: Fleet, tmp_path: Path, ref30: tuple[dict[str, Any], list[float]]) -> None:
    """kill -9 of a detached job's supervisor: its workers and `logs -f` end, the devices are
    freed, the job is `interrupted`. Its newest checkpoint is then damaged on disk: `--resume`
    says which it resumes from, sets it aside, resumes from the one before and still ends with
    the uninterrupted weights. The job costs both clusters made for it, as the ledger says."""
    ref_weights, _ = ref30
    losses, out = tmp_path / "losses.jsonl", tmp_path / "out.pt"
    fleet.ok("run", "-d", "--gpu", "cpu", "--count", "2", "--name", "orphan", "-y", SURVIVE,
             "--", "--steps", str(STEPS), "--every", "5", "--step-sleep", str(KILL_STEP_SLEEP_S),
             "--slow-until", "1000", "--wait-at", "12", "--gate", str(tmp_path / "go"),
             "--losses", str(losses), "--out", str(out))
    follower = fleet.popen("logs", "orphan", "-f")
    try:
        fleet.wait_for_step("orphan", 12)
        sup = [p for p in psutil.process_iter(["cmdline"])
               if "gpufleet.supervise.supervisor" in " ".join(p.info["cmdline"] or [])
               and p.environ().get("GPUFLEET_HOME") == str(fleet.home)]
        assert len(sup) == 1
        sup[0].kill()
        (tmp_path / "go").touch()  # for the resumed run, which passes step 12 again
        try:
            follower.communicate(timeout=8)
            followed_on = False
        except subprocess.TimeoutExpired:
            followed_on = True
        left = wait_no_leftovers(fleet.home, timeout=15)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert not followed_on, "logs -f still following 8 s after the supervisor died"
    assert left == [], f"outlived their supervisor: {left}"
    s = fleet.status("orphan")
    assert s["status"] == "interrupted"
    assert fleet.clusters() == [], "the job's devices are freed"

    folder = fleet.home / "jobs" / "orphan" / "checkpoints"
    newest = sorted(p for p in folder.iterdir()
                    if p.name.startswith("step-") and (p / "manifest.json").is_file())[-1]
    step = int(newest.name.removeprefix("step-"))
    assert step >= 10, newest
    shard = newest / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)
    first = fleet.status("orphan")["cost_usd"]  # reconciled: the killed run's cost, unbooked
    resumed = fleet.ok("run", "--resume", "orphan", "-y", timeout=120)
    assert f"Resuming orphan: from gpufleet's checkpoint at step {step} ({newest}), or the one " \
           "before it if that one is found damaged." in resumed.stdout, resumed.stdout[:2000]
    s = fleet.status("orphan")
    assert s["status"] == "succeeded" and s["step"] == STEPS
    skipped = [e["reason"] for e in s["events"] if e["kind"] == "checkpoint_skipped"]
    assert any(f"step {step}" in r and "checksum mismatch" in r for r in skipped), skipped
    assert reason_of(s, "resumed") == f"from the checkpoint at step {step - 5}"
    assert (folder / f"{newest.name}.corrupt").is_dir(), "the damaged one is set aside"
    assert same_weights(torch.load(out), ref_weights)
    assert fleet.clusters() == []
    # billing: the job costs both clusters made for it (the killed run's and the resumed one's),
    # and the ledger holds exactly that, to the micro-dollar, with no idle time
    made = fleet.clusters(all_=True)
    assert len(made) == 2 and all(c["status"] == "stopped" for c in made), made
    both = sum(round(c["cost_usd"] * 1e6) for c in made)
    booked = {g["job"]: g["micro_usd"] for g in fleet.json("usage", "--by", "job", "--json")["groups"]}
    assert booked == {"orphan": both}, (booked, made)
    assert round(s["cost_usd"] * 1e6) == both
    assert [r["cost_usd"] for r in fleet.json("jobs", "--json")] == [s["cost_usd"]]
    assert s["cost_usd"] > first > 0


def test_elastic_shrink_that_hurts_goodput_is_reverted_keeping_the_loss_curve(
        fleet: Fleet, tmp_path: Path) -> None:
    steps = 80
    ref_weights, ref_losses = reference(tmp_path / "ref", steps=steps)
    losses, out = tmp_path / "losses.jsonl", tmp_path / "out.pt"
    # Sleeping steps (utilization ~0.03 <= 0.2) make the autoscaler try 2 -> 1. On one worker
    # every step sleeps 2 s more (--alone-sleep): about 2.3 s a step against 0.25 s on two, so
    # the samples per $ fall by ~80% (the 10% tolerance holds while a two-worker step takes
    # under 1 s, four times its time on an idle host) and the shrink is reverted: 1 -> 2.
    r = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "elastic", "-y",
              "--workers", "1:2", "--scale-down-util", "0.2", "--cooldown", "3s", SURVIVE, "--",
              "--steps", str(steps), "--every", "1000", "--step-sleep", "0.25",
              "--slow-until", str(steps), "--alone-sleep", "2", "--losses", str(losses),
              "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = fleet.status("elastic")
    story = "\n".join(f"{e['kind']}: {e['reason']}" for e in s["events"])
    told = [(e["kind"], e["reason"]) for e in s["events"]
            if e["kind"] in ("resizing", "resized", "resize_kept", "resize_reverted")]
    assert [k for k, _ in told] == ["resizing", "resized", "resize_reverted", "resizing",
                                    "resized"], story
    assert told[0][1].startswith("2 -> 1 workers: utilization ") and \
        re.search(r"; trying it against [\d.]+ samples/s \([\d.]+[kMG]? samples per \$\) on 2$",
                  told[0][1]), story
    assert told[1][1].startswith("2 -> 1 workers from the checkpoint"), story
    figures = (r"throughput fell \d+% after 2 -> 1 \([\d.]+ -> [\d.]+ samples/s; samples per \$ "
               r"[\d.]+[kMG]? -> [\d.]+[kMG]?, -\d+%, more than the 10% tolerance\); reverted to 2; "
               r"no shrinking for 5m")
    assert re.fullmatch(figures, told[2][1]), story
    assert told[3][1].startswith("1 -> 2 workers: reverting (throughput fell "), story
    assert told[4][1].startswith("1 -> 2 workers from the checkpoint"), story
    (finding,) = [f for f in s["findings"] if f["rule"] == "elastic"]
    assert finding["severity"] == "warning" and finding["active"]
    assert finding["title"] == "Shrinking 2 -> 1 workers lowered goodput; reverted"
    assert finding["detail"].startswith("Throughput fell ") and "samples per $" in finding["detail"]
    shown = fleet("status", "elastic", env={"COLUMNS": "500"}).stdout
    assert "Shrinking 2 -> 1 workers lowered goodput; reverted" in shown, shown
    assert s["step"] == steps and s["world_size"] == 2
    rows = read_losses(losses)
    assert {r["world"] for r in rows} == {1, 2}
    assert all(r["accum"] == 2 // r["world"] for r in rows), "the global batch stays the same"
    final = {r["step"]: r["loss"] for r in rows}
    assert sorted(final) == list(range(1, steps + 1))
    # Same samples per step in the same order, summed in another order: equal up to rounding.
    for step in range(1, steps + 1):
        assert final[step] == pytest.approx(ref_losses[step - 1], rel=1e-4, abs=1e-6), step
    got = torch.load(out)
    assert all(torch.allclose(got[k], ref_weights[k], rtol=1e-4, atol=1e-6) for k in got)
    assert fleet.clusters() == [], "the cluster made for the job is freed at the end"
