"""`--framework ray` runs ordinary scripts, written for torchrun and knowing nothing of gpufleet:
one that calls `init_process_group` itself (Ray Train has joined a group already) and one that
joins through `init_device_mesh`. Each trains on 2 CPU slots through the real CLI and Ray; its
step progress comes from the worker bootstrap (the scripts never report), and the supervisor's
CPU sampler finds both Ray ranks (which have no RANK in their process environment) and records
per-rank device rows. About 40-60 s per run on 2 busy cores, most of it Ray starting."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path

from fleet_helpers import WORKERS, Fleet, tracebacks_not_rays

RUN_TIMEOUT = 300
STEPS = 20
# 0.1 s a step: more than the bootstrap's 0.05 s batching, so every step up to the last is
# reported
ARGS = ["--max_steps", str(STEPS), "--sleep", "0.1"]


def run_on_ray(fleet: Fleet, name: str, script: str, *flags: str,
               args: list[str] = ARGS) -> subprocess.CompletedProcess[str]:
    """Run the script through Ray; its ranks wait after step 1 (--gate) until the sampler has
    recorded a device row for each, so no load can end the job before they are found."""
    gate = fleet.cwd / f"{name}.gate"
    proc = fleet.popen("run", str(WORKERS / script), "--gpu", "cpu", "--count", "2", "--name",
                       name, "--framework", "ray", "-y", *flags, "--", *args, "--gate",
                       str(gate))
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if _both_ranks_sampled(fleet.home, name):
                break
            time.sleep(0.5)
        gate.touch()
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()  # ours, by pid
            proc.communicate()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert tracebacks_not_rays(r.stdout + r.stderr) == []
    assert "initialize the default process group twice" not in r.stdout + r.stderr
    return r


def device_rows(home: Path, job: str) -> dict[int, list[tuple[str, float]]]:
    """The job's per-rank CPU-slot utilization rows: rank -> [(device, value)]."""
    with sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True) as db:
        rows = db.execute("select rank, device, value from metrics where job = ? and "
                          "name = 'gpu_utilization'", (job,)).fetchall()
    out: dict[int, list[tuple[str, float]]] = {}
    for rank, device, value in rows:
        out.setdefault(rank, []).append((device, value))
    return out


def _both_ranks_sampled(home: Path, job: str) -> bool:
    if not (home / "state.db").exists():
        return False
    try:
        return set(device_rows(home, job)) >= {0, 1}
    except sqlite3.Error:  # the store not made yet, or busy: look again
        return False


def assert_trained_with_telemetry(fleet: Fleet, name: str, steps: int | None = STEPS) -> None:
    s = fleet.status(name)
    assert s["status"] == "succeeded", s
    assert s["world_size"] == 2
    assert s["step"] == steps, "every optimizer step counted by the bootstrap (if armed)"
    assert_device_rows(fleet, name)


def assert_device_rows(fleet: Fleet, name: str) -> None:
    rows = device_rows(fleet.home, name)
    assert set(rows) == {0, 1}, f"device rows for both Ray ranks: {sorted(rows)}"
    for rank, samples in rows.items():
        assert {d for d, _ in samples} == {f"cpu{rank}"}, samples
        assert all(0.0 <= v <= 1.0 for _, v in samples), samples
    assert fleet.clusters() == [], "the job's own cluster is freed"


def test_a_script_calling_init_process_group_runs_under_ray(fleet: Fleet) -> None:
    r = run_on_ray(fleet, "ray-plain", "plain_ddp.py")  # it ends with sys.exit(0), too
    assert f"step {STEPS}: loss" in r.stdout
    assert_trained_with_telemetry(fleet, "ray-plain")
    logs = fleet.home / "jobs" / "ray-plain" / "logs"
    assert (logs / "rank0.log").exists() and (logs / "rank1.log").exists()


def test_an_init_device_mesh_script_runs_and_its_ranks_are_found_without_the_bootstrap(
        fleet: Fleet) -> None:
    """The mesh script with the bootstrap off (one Ray run covers both, as each costs 30-50 s):
    nothing reports a step (no bootstrap, no SDK), so only the note each Ray worker sends as it
    starts tells the sampler which process is which rank. 3 s of training at 0.15 s a step
    leaves the sampler (once a second) time to measure both ranks."""
    r = run_on_ray(fleet, "ray-mesh", "plain_mesh.py", "--no-bootstrap",
                   args=["--max_steps", str(STEPS), "--sleep", "0.15"])
    logs = fleet.home / "jobs" / "ray-mesh" / "logs"
    for rank in (0, 1):
        assert f"rank {rank} of 2: mesh (2,)" in (logs / f"rank{rank}.log").read_text()
    assert "parameters agree across 2 ranks" in r.stdout, r.stdout[-3000:]
    assert_trained_with_telemetry(fleet, "ray-mesh", steps=None)
