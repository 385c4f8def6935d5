"""The plan of the workdir that travels on Ray and Slurm: the folder that travels, a node's entry
rewritten to its copy, what the Slurm driver would run (sbcast) and what a node's step does with
the tar (placed for real, setup run), and the agent a Ray node runs (called here without Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends import node_workdir, slurm_cmds, slurm_travel, workdir_ship
from gpufleet.backends.node_ship import ShippingAgent
from gpufleet.backends.node_workdir import SetupFailed
from gpufleet.backends.shipping import Sharing
from gpufleet.errors import GpufleetError, SpecError
from gpufleet.launch import travel
from gpufleet.launch.workdir import UploadTooLarge


def test_the_folder_that_travels() -> None:
    assert travel.shipped_root("/home/a/proj", "train.py") == "/home/a/proj"
    assert travel.shipped_root("/home/a/proj", "src/train.py") == "/home/a/proj"
    assert travel.shipped_root("/home/a/proj", "/home/a/proj/x/t.py") == "/home/a/proj"
    assert travel.shipped_root(None, "/home/a/proj/t.py") == "/home/a/proj"
    for outside in ("../other/t.py", "/elsewhere/t.py", "/home/a/project2/t.py"):
        with pytest.raises(SpecError, match="outside the workdir /home/a/proj"):
            travel.shipped_root("/home/a/proj", outside)
    # in the plan a script outside is a problem only if the folder must travel
    sec = travel.section("/home/a/proj", "../t.py", None, None, False)
    assert sec["root"] == "/home/a/proj" and "outside the workdir" in sec["problem"]
    assert sec["max_upload"] == 100 * 2**20 and sec["setup"] == "" and sec["keep"] is False


def test_a_node_entry_runs_in_its_copy() -> None:
    entry = {"name": "worker1", "cwd": "/home/a/proj", "sampling": {},
             "argv": ["{python}", "-m", "torch.distributed.run", "--log-dir", "/gf/jobs/j/torchrun",
                      "train.py", "--data=/home/a/proj/data", "/home/a/proj/cfg.yaml",
                      "/home/a/project2/x"],
             "env": {"CFG": "/home/a/proj/cfg.yaml", "GPUFLEET_JOB_DIR": "/gf/jobs/j"}}
    got = travel.on_node(entry, "/home/a/proj", "/n/cache/abc", "/gf/jobs/j")
    assert got["cwd"] == "/n/cache/abc"
    assert got["argv"][-4:] == ["train.py", "--data=/n/cache/abc/data", "/n/cache/abc/cfg.yaml",
                                "/home/a/project2/x"]  # a sibling folder is not the workdir
    assert got["argv"][4] == "/gf/jobs/j/torchrun"  # the job folder is not remapped here
    assert got["env"] == {"CFG": "/n/cache/abc/cfg.yaml", "GPUFLEET_JOB_DIR": "/gf/jobs/j"}
    assert got["files_back"] == "/gf/jobs/j"  # what torchrun writes there comes back
    assert entry["cwd"] == "/home/a/proj" and "files_back" not in entry  # the plan's own entry


def _plan(root: Path, setup: str = "", keep: bool = False) -> dict[str, Any]:
    node = {"name": "head", "node_id": "n1", "cwd": str(root), "argv": ["{python}", "train.py"],
            "env": {}, "sampling": {}}
    return {"job": "j", "job_id": "41", "report_addr": "127.0.0.1:1",
            "nodes": [node, {**node, "name": "worker1", "node_id": "n2"}],
            "workdir": travel.section(str(root), "train.py", setup, None, keep)}


def test_what_the_slurm_driver_would_run(tmp_path: Path) -> None:
    plan_path = tmp_path / "jobs" / "j" / "slurm-plan.json"
    plan = _plan(tmp_path / "proj")
    digest = "ab" * 32
    out, steps, plans = slurm_travel.travel_plan(plan, plan_path, [1], digest,
                                                 tmp_path / "w.tar.gz", "j-7")
    assert out["travel"] == {"digest": digest, "unseen": [1], "user": "j-7",
                             "job_dir": str(plan_path.parent),
                             "tar": f"/tmp/gpufleet-workdir-{digest[:16]}.tar.gz"}
    assert steps == [["sbcast", "--jobid=41", "--force", str(tmp_path / "w.tar.gz"),
                      f"/tmp/gpufleet-workdir-{digest[:16]}.tar.gz"],
                     ["sbcast", "--jobid=41", "--force", str(plan_path), "/tmp/gpufleet-plan-j-7.json"]]
    assert plans == {0: plan_path, 1: Path("/tmp/gpufleet-plan-j-7.json")}
    # every node sees the job folder (setup only): nothing is broadcast, steps read the plan
    _, steps, plans = slurm_travel.travel_plan(plan, plan_path, [], digest, None, "j-7")
    assert steps == [] and plans == {0: plan_path, 1: plan_path}


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "data" / "a.txt").write_text("a\n")
    (root / "big.bin").write_bytes(b"x" * 4096)
    (root / ".gpufleetignore").write_text("big.bin\n")
    return root


def test_a_slurm_node_places_its_copy_and_runs_setup_once(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(tmp_path)
    monkeypatch.setenv(node_workdir.CACHE_ENV, str(tmp_path / "node-cache"))
    plan = _plan(root, setup="echo set up in $(basename $(pwd))")
    packed = workdir_ship.pack(plan["workdir"], ships=True)
    assert [e.path for e in packed.sel.entries] == [".gpufleetignore", "data/a.txt", "train.py"]
    tar = tmp_path / "node-tmp.tar.gz"  # where sbcast would have put it
    tar.write_bytes(packed.tar)
    plan["travel"] = {"digest": packed.sel.digest, "unseen": [1], "tar": str(tar), "user": "j-7",
                      "job_dir": "/gf/jobs/j"}
    said: list[str] = []
    entry = slurm_travel.placed(plan, 1, said.extend)
    copy = tmp_path / "node-cache" / packed.sel.digest
    assert entry["cwd"] == str(copy) and (copy / "data" / "a.txt").read_text() == "a\n"
    assert entry["files_back"] == "/gf/jobs/j"  # it does not see the job folder: files come back
    assert not (copy / "big.bin").exists() and not tar.exists()  # the node-local tar is gone
    assert said == [f"setup: set up in {packed.sel.digest}"]
    # node 0 sees the job folder: it runs where it is, and setup is already done on this "node"
    assert slurm_travel.placed(plan, 0, said.extend) == plan["nodes"][0] and len(said) == 1
    assert "files_back" not in plan["nodes"][0]  # a node that sees it must not copy onto itself
    assert node_workdir.remove(tmp_path / "node-cache", packed.sel.digest, "j-7")


def test_refusals_become_the_runs_reason(tmp_path: Path) -> None:
    root = _project(tmp_path)
    sec = travel.section(str(root), "../elsewhere.py", None, None, False)
    with pytest.raises(GpufleetError, match="outside the workdir") as outside:
        workdir_ship.pack(sec, ships=True)
    assert workdir_ship.error_line(outside.value).startswith("WorkdirError: script: ")
    assert workdir_ship.pack(sec, ships=False).tar == b""  # nodes that see it: nothing packed
    with pytest.raises(UploadTooLarge):
        workdir_ship.pack({**travel.section(str(root), "train.py", None, None, False),
                           "max_upload": 10}, ships=True)
    failed = SetupFailed("worker1", 2, ["boom"])
    assert workdir_ship.error_line(failed) == "SetupError: setup failed on worker1 (exit 2): boom"
    assert workdir_ship.needed({"setup": ""}, Sharing({"n1": True})) is False
    assert workdir_ship.needed({"setup": "make"}, Sharing({"n1": True})) is True
    assert workdir_ship.needed({"setup": ""}, Sharing({"n1": True, "n2": False})) is True


def test_the_ray_agent_places_the_tar_it_is_handed(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor's methods, called in this process (Ray would call them on the node)."""
    import pickle

    root = _project(tmp_path)
    monkeypatch.setenv(node_workdir.CACHE_ENV, str(tmp_path / "cache"))
    packed = workdir_ship.pack(travel.section(str(root), "train.py", None, None, False), True)
    agent = ShippingAgent("n2", "127.0.0.1:1")
    probe = tmp_path / "probe"
    probe.write_text("c0ffee")
    assert agent.sees(str(probe), "c0ffee") and not agent.sees(str(probe), "other")
    assert not agent.has_workdir(packed.sel.digest)
    folder = agent.place_workdir(packed.sel.digest, packed.tar, "echo hi", "j-1", "worker1")
    assert agent.has_workdir(packed.sel.digest) and Path(folder, "train.py").exists()
    assert list(agent.lines) == ["setup: hi"]
    with pytest.raises(SetupFailed) as err:
        agent.place_workdir(packed.sel.digest, None, "echo no; exit 4", "j-1", "worker1")
    back = pickle.loads(pickle.dumps(err.value))  # as Ray carries it to the driver
    assert str(back) == "setup failed on worker1 (exit 4): no"
    assert agent.remove_workdir(packed.sel.digest, "j-1") and not agent.has_workdir(packed.sel.digest)


def test_an_sbcast_that_missed_only_nodes_outside_the_run_is_said_not_failed() -> None:
    argv = ["sbcast", "--jobid=2", "--force", "/j/w.tar.gz", "/tmp/w.tar.gz"]
    dead = "sbcast: error: REQUEST_FILE_BCAST(n2): Communication connection failure\n"
    said: list[str] = []
    slurm_travel.judge_bcast(argv, dead, ["n1", "n3"], said.append)  # n2: lost, not in the run
    assert len(said) == 1 and said[0].startswith("sbcast did not reach n2, not a node of this run")
    with pytest.raises(GpufleetError, match=r"REQUEST_FILE_BCAST\(n2\): Communication"):
        slurm_travel.judge_bcast(argv, dead, ["n1", "n2"], said.append)  # a node of the run
    with pytest.raises(GpufleetError, match="Invalid job id"):  # no node named: nothing is known
        slurm_travel.judge_bcast(argv, "sbcast: error: Invalid job id specified\n", ["n1"],
                                 said.append)
    folded = "sbcast: error: REQUEST_FILE_BCAST(gpu-[07-08]): Communication connection failure"
    assert slurm_cmds.bcast_missed(folded) == ["gpu-07", "gpu-08"]
    assert slurm_cmds.bcast_missed(f"{dead}sbcast: error: Unable to read file\n") is None
    assert len(said) == 1
