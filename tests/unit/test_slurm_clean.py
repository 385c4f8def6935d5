"""A Slurm run's clean-up of its shipped workdir: which cache a node uses (its own user's, not
the $HOME srun carries from the submitter), the step the driver would run after a run, the
line it logs, and what a node's clean-up does to a real cache (run as the step runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends import node_workdir, slurm_clean, slurm_run, workdir_ship
from gpufleet.launch import travel


def test_a_node_cache_is_the_node_users_own_whatever_home_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    submitter = {"HOME": "/home/alice"}  # what srun --export=ALL carries to the node
    assert node_workdir.cache_root(submitter, "/home/slurmuser") == \
        Path("/home/slurmuser/.cache/gpufleet/workdirs")
    assert node_workdir.cache_root({**submitter, node_workdir.CACHE_ENV: "/scratch/gf"},
                                   "/home/slurmuser") == Path("/scratch/gf")
    assert node_workdir.cache_root({node_workdir.CACHE_ENV: "~/c"}, "/home/u") == Path("/home/u/c")
    # without a home given, ~ is $HOME as before (ssh and Ray nodes run in the node's own login)
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert node_workdir.cache_root({}) == tmp_path / "h" / ".cache/gpufleet/workdirs"
    # on a Slurm node: the password database's home, not the $HOME of the submitter
    monkeypatch.delenv(node_workdir.CACHE_ENV, raising=False)
    own = node_workdir.own_home()
    assert own != str(tmp_path / "h") and Path(own).is_absolute()
    assert slurm_clean.node_cache() == Path(own, ".cache/gpufleet/workdirs")


def test_the_driver_does_not_send_the_submitters_cache_to_the_nodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(node_workdir.CACHE_ENV, str(tmp_path / "submitter-cache"))
    driver = slurm_run.Driver({"job_id": "41", "nodes": []}, tmp_path / "slurm-plan.json")
    assert node_workdir.CACHE_ENV not in driver.env and "PATH" in driver.env


def _travelled(keep: bool = False) -> dict[str, Any]:
    nodes = [{"name": n, "node_id": f"n{i + 1}"} for i, n in enumerate(["head", "w1", "w2"])]
    return {"job_id": "41", "nodes": nodes,
            "workdir": {"root": "/p", "keep": keep},
            "travel": {"digest": "ab" * 32, "unseen": [1, 2], "user": "j-7",
                       "tar": "/tmp/gpufleet-workdir-abab.tar.gz"}}


def test_the_clean_up_step_covers_the_shipped_nodes_not_lost() -> None:
    plan = _travelled()
    plans = {0: Path("/gf/jobs/j/slurm-plan.json"), 1: Path("/tmp/gpufleet-plan-j-7.json"),
             2: Path("/tmp/gpufleet-plan-j-7.json")}
    step = slurm_clean.plan_step(plan, plans, {"n3"}, "/opt/node/bin/python")
    assert step == ["srun", "--jobid=41", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                    "--nodelist=n2", "--overlap", "--quiet", "--job-name=gpufleet-clean",
                    "--chdir=/", "/opt/node/bin/python", "-m", "gpufleet.backends.slurm_clean",
                    "ab" * 32, "j-7", "drop", "/tmp/gpufleet-workdir-abab.tar.gz",
                    "/tmp/gpufleet-plan-j-7.json"]
    kept = slurm_clean.plan_step(_travelled(keep=True), plans, set(), "py")
    assert kept is not None and "--nodelist=n2,n3" in kept and kept[kept.index("j-7") + 1] == "keep"
    assert slurm_clean.plan_step(plan, plans, {"n2", "n3"}, "py") is None  # all lost
    assert slurm_clean.plan_step({**plan, "travel": None}, plans, set(), "py") is None
    assert slurm_clean.plan_step({**plan, "travel": {**plan["travel"], "unseen": []}}, plans,
                                 set(), "py") is None  # every node saw the job folder


def test_the_clean_up_line_says_what_each_node_did_or_warns() -> None:
    d = "workdir " + "cd" * 6
    out = "gpufleet-clean w2 removed\ngpufleet-clean w1 in use\n"
    assert slurm_clean.report(d, ["w1", "w2"], 0, out, 1.26) == \
        "workdir cdcdcdcdcdcd clean-up in 1.3s: w1 in use, w2 removed"
    late = slurm_clean.report(d, ["w1", "w2"], None, "gpufleet-clean w1 removed\n", 30.0)
    assert late == ("warning: workdir cdcdcdcdcdcd clean-up timed out after 30s (30.0s); "
                    "no answer from w2; done: w1 removed")
    failed = slurm_clean.report(d, ["w1"], 1, "srun: error: Unable to create step\n", 0.4)
    assert failed == ("warning: workdir cdcdcdcdcdcd clean-up exit 1 (0.4s); no answer from w1: "
                      "srun: error: Unable to create step")
    # a node that answered but the step failed (another node's srun error): still a warning
    assert slurm_clean.report(d, ["w1"], 1, "gpufleet-clean w1 removed\n", 2.0) == (
        "warning: workdir cdcdcdcdcdcd clean-up exit 1 (2.0s); done: w1 removed")
    assert "Error:" not in failed.split(":")[0]  # never read as the run's reason


def _clean(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, node_workdir.CACHE_ENV: str(cache), "SLURMD_NODENAME": "n2"}
    return subprocess.run([sys.executable, "-m", "gpufleet.backends.slurm_clean", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_a_nodes_clean_up_removes_the_copy_and_the_files_sbcast_left(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    packed = workdir_ship.pack(travel.section(str(proj), "train.py", None, None, False), True)
    digest, cache = packed.sel.digest, tmp_path / "cache"
    tar = tmp_path / "w.tar.gz"
    tar.write_bytes(packed.tar)
    with tar.open("rb") as stream:  # as a node's step placed it, for two jobs
        node_workdir.place(cache, digest, stream, "echo once", lambda _: None, user="j-7")
    node_workdir.place(cache, digest, None, "echo once", lambda _: None, user="j-8")
    left = Path(f"/tmp/gpufleet-plan-test-{uuid.uuid4().hex}.json")
    left.write_text("{}")
    try:
        done = _clean(cache, digest, "j-7", "drop", str(left))
        assert (done.returncode, done.stdout) == (0, "gpufleet-clean n2 in use\n"), done.stderr
        assert (cache / digest / "train.py").exists() and not left.exists()
        assert _clean(cache, digest, "j-8", "keep").stdout == "gpufleet-clean n2 kept\n"
        assert (cache / digest).is_dir()
        assert _clean(cache, digest, "j-8", "drop").stdout == "gpufleet-clean n2 removed\n"
        assert sorted(p.name for p in cache.iterdir()) == []  # copy, marks, setup marker gone
        assert _clean(cache, digest, "j-8", "drop").stdout == "gpufleet-clean n2 absent\n"
    finally:
        left.unlink(missing_ok=True)
    bad = _clean(cache, "../../etc", "j-8", "drop")
    assert bad.returncode == 2 and bad.stderr.startswith("error: clean-up on this node: ")
    assert "Traceback" not in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_a_run_in_an_image_cleans_every_node_not_lost_of_the_jobs_containers() -> None:
    """A stop SIGKILLs the step, the keeper that would remove the container with it: the
    clean-up step then covers every node that ran a container, shipped copy or not."""
    nodes = [{"name": n, "node_id": f"n{i + 1}", "container": {"image": "x/y:1"}}
             for i, n in enumerate(["head", "w1", "w2"])]
    plan = {"job_id": "41", "job": "train-7", "nodes": nodes, "travel": None}
    step = slurm_clean.plan_step(plan, {}, {"n2"}, "py")
    assert step is not None and "--nodelist=n1,n3" in step
    assert step[step.index("gpufleet.backends.slurm_clean") + 1:] == [
        "-", "-", "drop", "--containers", "train-7"]
    assert slurm_clean.cleaned_nodes(plan, set()) == [0, 1, 2]
    bare = {**plan, "nodes": [{**n, "container": None} for n in nodes]}
    assert slurm_clean.plan_step(bare, {}, set(), "py") is None  # nothing to clean
    assert slurm_clean.report("containers", ["head"], 0,
                              "gpufleet-clean head no copy, 1 container(s) removed\n", 0.5) == \
        "containers clean-up in 0.5s: head no copy, 1 container(s) removed"
