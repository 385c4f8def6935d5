"""Spares on a Slurm pool (backends/slurm_spares.py): the warm and release steps the driver
would run (pure), the driver's reading of the warm step's output (a real process standing in
for srun), and what a spare does in its step, run as the step runs it, on a real cache: the
shipped copy placed or the seen folder used, the setup run once, both marked with the job so a
run's own clean-up leaves them, and the job's mark dropped from every copy it is on."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from gpufleet.backends import node_workdir, slurm_spares
from gpufleet.launch.workdir import select, write_tar


def _plan(unseen: list[int], spares: tuple[str, ...] = ("n3",), keep: bool = False,
          root: str = "/p", setup: str = "echo hi") -> dict[str, Any]:
    return {"job_id": "41", "job": "train-7", "spares": [{"node_id": s} for s in spares],
            "spared": True,
            "nodes": [{"name": "head", "node_id": "n1"}, {"name": "worker1", "node_id": "n2"}],
            "workdir": {"root": root, "keep": keep, "setup": setup},
            "travel": {"digest": "ab" * 32, "unseen": unseen, "user": "train-7-99",
                       "tar": "/tmp/gpufleet-workdir-abab.tar.gz" if unseen else None}}


def test_the_warm_step_runs_on_the_spares_and_reads_the_plan_where_it_landed() -> None:
    step = slurm_spares.warm_argv(_plan([0, 1]), Path("/gf/jobs/j/slurm-plan.json"), "py")
    assert step == ["srun", "--jobid=41", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                    "--nodelist=n3", "--overlap", "--quiet", "--job-name=gpufleet-warm",
                    "--chdir=/", "py", "-m", "gpufleet.backends.slurm_spares",
                    "/tmp/gpufleet-plan-train-7-99.json"]  # where sbcast put it
    seen = slurm_spares.warm_argv(_plan([]), Path("/gf/jobs/j/slurm-plan.json"), "py")
    assert seen is not None and seen[-1] == "/gf/jobs/j/slurm-plan.json"
    assert slurm_spares.warm_argv(_plan([], spares=()), Path("/p.json"), "py") is None
    assert slurm_spares.warm_argv({**_plan([]), "travel": None}, Path("/p.json"), "py") is None


def test_the_release_step_covers_nodes_and_spares_not_lost_with_every_copy() -> None:
    step = slurm_spares.release_argv(_plan([0, 1]), {"n2"}, "py")
    assert step is not None and "--nodelist=n1,n3" in step and "--nodes=2" in step
    assert step[step.index("gpufleet.backends.slurm_clean") + 1:] == [
        "*", "train-7", "drop", "/tmp/gpufleet-workdir-abab.tar.gz",
        "/tmp/gpufleet-plan-train-7-99.json"]
    assert slurm_spares.release_argv(_plan([0, 1], keep=True), set(), "py") is None
    # the spare made a node by a heal: the nodes still hold the job's mark
    used = slurm_spares.release_argv(_plan([0, 1], spares=()), {"n2"}, "py")
    assert used is not None and "--nodelist=n1" in used and "--nodes=1" in used
    assert slurm_spares.release_argv({**_plan([0, 1]), "spared": False}, set(), "py") is None
    # the last run's workdir never travelled (its sbcast failed): the earlier runs' marks go
    untravelled = {k: v for k, v in _plan([0, 1]).items() if k != "travel"}
    bare = slurm_spares.release_argv(untravelled, {"n2"}, "py")
    assert bare is not None and bare[bare.index("gpufleet.backends.slurm_clean") + 1:] == [
        "*", "train-7", "drop"]


def test_the_driver_says_each_spares_outcome_and_one_it_did_not_hear_from(
        tmp_path: Path) -> None:
    """The warm step's output, from a real process in srun's place."""
    fake = tmp_path / "fake_srun.py"
    fake.write_text(textwrap.dedent("""
        print("gpufleet-warm n3 say installing")
        print("gpufleet-warm n3 done 1.2 s: workdir abab placed, setup ran")
        print("srun: error: n4: task 1: Exited with exit code 1")
        raise SystemExit(1)
    """))
    heard: list[str] = []
    warming = slurm_spares.Warming([sys.executable, str(fake)], os.environ, heard.append,
                                   ["n3", "n4"])
    warming.start()
    warming.thread.join(timeout=30)
    assert heard == ["spare n3: setup: installing",
                     "spare n3 warm in 1.2 s: workdir abab placed, setup ran",
                     "spare(s) n4 not warmed: the warm step ended (exit 1): srun: error: n4: "
                     "task 1: Exited with exit code 1"]


def _warm(plan_path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, node_workdir.CACHE_ENV: str(cache), "SLURMD_NODENAME": "n3"}
    return subprocess.run([sys.executable, "-m", "gpufleet.backends.slurm_spares",
                           str(plan_path)], env=env, capture_output=True, text=True, timeout=60)


def test_a_spare_places_the_shipped_copy_once_and_keeps_it_past_a_runs_clean_up(
        tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    sel = select(src)
    tar = tmp_path / "w.tar.gz"
    with tar.open("wb") as f:
        write_tar(sel, f)
    count = tmp_path / "setups"
    plan = _plan([0, 1], setup=f"echo run >> {count}; echo installing")
    plan["travel"] = {**plan["travel"], "digest": sel.digest, "tar": str(tar)}
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    cache = tmp_path / "cache"
    done = _warm(plan_path, cache)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "gpufleet-warm n3 say installing"
    assert lines[1].startswith("gpufleet-warm n3 done ")
    assert lines[1].endswith(f"s: workdir {sel.digest[:12]} placed, setup ran")
    assert (cache / sel.digest / "train.py").exists() and count.read_text() == "run\n"
    assert not tar.exists() and not plan_path.exists()  # node-local files, read once
    # the run that uses the former spare: nothing unpacked (no tar), no setup again; its own
    # clean-up (its run mark) leaves the copy, which the job's mark keeps
    node_workdir.place(cache, sel.digest, None, plan["workdir"]["setup"], print, user="run-2")
    assert not node_workdir.remove(cache, sel.digest, "run-2")
    assert node_workdir.has(cache, sel.digest) and count.read_text() == "run\n"
    assert node_workdir.remove_everywhere(cache, "train-7") == [sel.digest]
    assert list(cache.iterdir()) == []


def test_a_spare_that_sees_the_folder_sets_up_there_and_one_that_does_not_says_why(
        tmp_path: Path) -> None:
    src = tmp_path / "shared"
    src.mkdir()
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(_plan([], root=str(src), setup="echo in $(pwd)")))
    cache = tmp_path / "cache"
    done = _warm(plan_path, cache)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"gpufleet-warm n3 say in {src}"
    assert done.stdout.splitlines()[1].endswith(f"workdir {src} seen here, setup ran")
    assert plan_path.exists()  # the job folder's plan, not a node-local copy
    again = _warm(plan_path, cache)
    assert again.stdout.splitlines()[-1].endswith("seen here, setup done before"), again.stdout
    # a run's own end (node_workdir.remove with its run mark) keeps the job's marker
    assert not node_workdir.remove(cache, "ab" * 32, "train-7-99")
    assert node_workdir.setup_marker(cache, "ab" * 32, "echo in $(pwd)").exists()
    assert node_workdir.remove_everywhere(cache, "train-7") == ["ab" * 32]
    assert list(cache.iterdir()) == []
    plan_path.write_text(json.dumps(_plan([], root=str(tmp_path / "not-here"))))
    lost = _warm(plan_path, cache)
    assert lost.returncode == 1
    assert lost.stdout == (f"gpufleet-warm n3 failed FileNotFoundError: n3 does not see the "
                           f"workdir {tmp_path / 'not-here'}\n")


def test_the_job_mark_goes_from_every_copy_it_is_on_and_leaves_other_jobs(
        tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    digests = []
    for text in ("a", "b"):  # a workdir the job wrote into: two digests over its runs
        src = tmp_path / text
        src.mkdir()
        (src / "x.py").write_text(text)
        sel = select(src)
        buf = io.BytesIO()
        write_tar(sel, buf)
        node_workdir.place(cache, sel.digest, io.BytesIO(buf.getvalue()), "", print,
                           user="train-7")
        digests.append(sel.digest)
    node_workdir.place(cache, digests[1], None, "", print, user="other-job")
    assert node_workdir.remove_everywhere(cache, "train-7") == [digests[0]]
    assert not node_workdir.has(cache, digests[0]) and node_workdir.has(cache, digests[1])
    assert node_workdir.remove_everywhere(cache, "train-7") == []
    assert node_workdir.remove_everywhere(tmp_path / "no-cache", "train-7") == []


def test_a_warm_step_still_running_when_the_run_ends_is_ended(tmp_path: Path) -> None:
    fake = tmp_path / "slow_srun.py"
    fake.write_text("import time\nprint('gpufleet-warm n3 say installing', flush=True)\n"
                    "time.sleep(600)\n")
    heard: list[str] = []
    warming = slurm_spares.Warming([sys.executable, str(fake)], os.environ, heard.append,
                                   ["n3"])
    warming.start()
    assert warming.proc is not None
    warming.stop()
    assert warming.proc.poll() is not None and not warming.thread.is_alive()
    assert heard[-1] == "spare(s) n3 not warmed: the run ended first", heard
