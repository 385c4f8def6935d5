"""The plan a Ray driver runs for a multi-node job (launch/multinode.py), the torchrun rendezvous
flags it is built from (launch/frameworks.py), and the node tags its output carries back
(backends/ray_run.tag, read by supervise/logs.split_line).

A wrong --node-rank, a second rendezvous host or a node on the wrong device type hangs or
misplaces the whole job, and a misread tag sends a rank's lines to the wrong log.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from placements import JOB_DIR, PY, ctx

from gpufleet.backends.ray_run import tag
from gpufleet.launch import multinode
from gpufleet.launch.container import Container
from gpufleet.launch.frameworks import Rendezvous, build
from gpufleet.pool.model import Device, Node, Placement
from gpufleet.spec import JobSpec
from gpufleet.supervise.logs import split_line
from gpufleet.telemetry.wire import NODE_ENV

HEAD, WORKER = "10.0.0.1", "10.0.0.2"
PORT = 29731


def devs(n: int, *, simulated: bool) -> tuple[Device, ...]:
    return tuple(Device(id=f"gpu{i}", index=i, gpu="H100-SXM", memory_bytes=80 * 10**9,
                        simulated=simulated) for i in range(n))


def cluster(per: int = 2, *, simulated: bool = True, addresses: tuple[str, ...] = (HEAD, WORKER),
            ) -> tuple[list[Placement], dict[str, Node]]:
    placements, nodes = [], {}
    for k, addr in enumerate(addresses):
        nid = f"ray-node-{k}"
        d = devs(per, simulated=simulated)
        nodes[nid] = Node(id=nid, address=addr, devices=d, gpu_fabric="nvswitch",
                          inter_fabric="infiniband", ref=f"rayid{k}")
        placements.append(Placement(nid, addr, d))
    return placements, nodes


def make_plan(framework: str = "torchrun", *, simulated: bool = True, loopback: bool = False,
              user_env: dict[str, str] | None = None, per: int = 2,
              addresses: tuple[str, ...] = (HEAD, WORKER), **fields: Any) -> dict[str, Any]:
    placements, nodes = cluster(per, simulated=simulated, addresses=addresses)
    spec = JobSpec(script="train.py", framework=framework, **fields)
    return multinode.plan(spec, spec.layout(per * len(placements)), placements, nodes,
                          ctx(fabric="infiniband"), port=PORT, run_id="train-ab12-0",
                          user_env=user_env or {}, ready_timeout_s=60.0,
                          address="10.0.0.1:6379", loopback=loopback, memory_per_slot=1 << 30)


def flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, (name, argv)
    return argv[argv.index(name) + 1]


# ---------------------------------------------------------------- node names


def test_node_names() -> None:
    assert multinode.node_names(1) == ["head"]
    assert multinode.node_names(4) == ["head", "worker1", "worker2", "worker3"]


# ---------------------------------------------------------------- the plan


def test_plan_top_level() -> None:
    p = make_plan()
    assert p["address"] == "10.0.0.1:6379"
    assert p["job"] == "train-ab12"
    assert p["report_addr"] == "127.0.0.1:5555"
    assert p["ready_timeout_s"] == 60.0
    assert [n["name"] for n in p["nodes"]] == ["head", "worker1"]
    assert [n["node_id"] for n in p["nodes"]] == ["ray-node-0", "ray-node-1"]
    assert [n["ray_id"] for n in p["nodes"]] == ["rayid0", "rayid1"]
    assert [n["address"] for n in p["nodes"]] == [HEAD, WORKER]
    assert json.loads(json.dumps(p)) == p  # written as ray-plan.json


def test_each_node_runs_torchrun_with_its_rank_in_one_rendezvous() -> None:
    nodes = make_plan(addresses=(HEAD, WORKER, "10.0.0.3"))["nodes"]
    for i, n in enumerate(nodes):
        argv = n["argv"]
        assert argv[:4] == ["{python}", "-m", "gpufleet.launch.warm", "--"]  # torchrun's own
        assert "--standalone" not in argv
        assert flag(argv, "--nnodes") == "3"
        assert "--node-rank" not in argv  # c10d ranks nodes as they join
        assert flag(argv, "--rdzv-conf") == f"is_host={int(i == 0)}"
        assert flag(argv, "--rdzv-backend") == "c10d"
        assert flag(argv, "--rdzv-endpoint") == f"{HEAD}:{PORT}"
        assert flag(argv, "--rdzv-id") == "train-ab12-0"
        assert flag(argv, "--rdzv-conf") == f"is_host={1 if i == 0 else 0}"
        assert flag(argv, "--local-addr") == n["address"]
        assert flag(argv, "--nproc-per-node") == "2"
        assert argv[-1] == "train.py"
    assert [n["argv"] for n in nodes].count(nodes[0]["argv"]) == 1


def test_the_interpreter_is_left_to_each_node() -> None:
    p = make_plan()
    assert all(n["argv"][0] == multinode.PYTHON == "{python}" for n in p["nodes"])
    assert all(PY not in n["argv"] for n in p["nodes"])


def test_simulated_devices_run_on_cpu_with_gloo() -> None:
    p = make_plan(simulated=True)
    for n in p["nodes"]:
        env = n["env"]
        assert env["GPUFLEET_BACKEND"] == "gloo"
        assert env["GPUFLEET_DEVICE"] == "cpu"
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert n["resources"] == {"gpufleet_gpu": 2}
        assert n["sampling"]["on_cpu"] is True
    assert [n["env"]["GPUFLEET_NODE"] for n in p["nodes"]] == ["head", "worker1"]


def test_each_node_labels_its_reports_with_the_pools_node() -> None:
    """The ranks' metrics and the node agent's device samples name the node as `pool list`
    does (the placement's node), not the cluster's head/worker1 nor "local"."""
    p = make_plan()
    assert [n["env"][NODE_ENV] for n in p["nodes"]] == [n["node_id"] for n in p["nodes"]]
    assert {n["env"][NODE_ENV] for n in p["nodes"]}.isdisjoint({"head", "worker1", "local"})


def test_real_gpus_ask_ray_for_gpus() -> None:
    p = make_plan(simulated=False)
    for n in p["nodes"]:
        env = n["env"]
        assert env["GPUFLEET_BACKEND"] == "nccl"
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert env["NCCL_IB_DISABLE"] == "0"
        assert n["resources"] == {"GPU": 2}
        assert n["sampling"]["on_cpu"] is False


def test_loopback_keeps_gloo_on_lo() -> None:
    assert all(n["env"]["GLOO_SOCKET_IFNAME"] == "lo"
               for n in make_plan(loopback=True, addresses=("127.0.0.1", "127.0.0.2"))["nodes"])
    assert all("GLOO_SOCKET_IFNAME" not in n["env"] for n in make_plan(loopback=False)["nodes"])
    mine = make_plan(loopback=True, user_env={"GLOO_SOCKET_IFNAME": "eth1"})
    assert all(n["env"]["GLOO_SOCKET_IFNAME"] == "eth1" for n in mine["nodes"])


def test_user_env_reaches_every_node() -> None:
    p = make_plan(user_env={"WANDB_PROJECT": "x", "OMP_NUM_THREADS": "3"})
    for n in p["nodes"]:
        assert n["env"]["WANDB_PROJECT"] == "x"
        assert n["sampling"]["threads"] == 3
        assert n["env"]["GPUFLEET_JOB"] == "train-ab12"
        assert n["env"]["GPUFLEET_REPORT_ADDR"] == "127.0.0.1:5555"


def test_sampling_keys_follow_the_node_order() -> None:
    p = make_plan(addresses=(HEAD, WORKER, "10.0.0.3"))
    assert [n["sampling"]["key_base"] for n in p["nodes"]] == [0, 2, 4]
    s = p["nodes"][1]["sampling"]
    assert s["devices"] == ["gpu0", "gpu1"]
    assert s["indices"] == [0, 1]
    assert s["memory_per_slot"] == 1 << 30
    assert s["threads"] == 16 // 2


def test_key_base_uses_devices_per_node() -> None:
    assert [n["sampling"]["key_base"] for n in make_plan(per=4)["nodes"]] == [0, 4]


def test_cwd_is_the_spec_workdir() -> None:
    assert make_plan()["nodes"][0]["cwd"] == "."
    assert make_plan(workdir="/srv/code")["nodes"][1]["cwd"] == "/srv/code"


def test_deepspeed_plan_carries_its_config() -> None:
    p = make_plan("deepspeed", strategy="zero2")
    for i, n in enumerate(p["nodes"]):
        assert flag(n["argv"], "--rdzv-conf") == f"is_host={int(i == 0)}"
        assert set(n["files"]) == {"ds_config.json"}
        assert json.loads(n["files"]["ds_config.json"])["zero_optimization"]["stage"] == 2
        assert n["env"]["GPUFLEET_DEEPSPEED_CONFIG"] == str(JOB_DIR / "ds_config.json")


@pytest.mark.parametrize("framework", ["accelerate", "ray", "horovod"])
def test_other_frameworks_do_not_run_on_several_nodes(framework: str) -> None:
    with pytest.raises(ValueError, match=f"{framework} does not run on several nodes"):
        make_plan(framework)


# ---------------------------------------------------------------- build(..., rdzv=...)


def test_build_without_rendezvous_is_standalone() -> None:
    placements, _ = cluster()
    spec = JobSpec(script="train.py", warm=False)
    cmd = build(spec, spec.layout(2), placements[0], ctx())
    assert cmd.argv[:6] == [PY, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    assert "--rdzv-endpoint" not in cmd.argv


def test_build_with_rendezvous() -> None:
    placements, _ = cluster()
    spec = JobSpec(script="train.py", args=["--lr", "3e-4"], warm=False)
    rdzv = Rendezvous(nnodes=2, node_rank=1, endpoint="head:1234", run_id="r1", local_addr=WORKER)
    cmd = build(spec, spec.layout(4), placements[1], ctx(), port=1234, rdzv=rdzv)
    assert cmd.argv[3:15] == ["--nnodes", "2", "--rdzv-backend", "c10d",
                              "--rdzv-endpoint", "head:1234", "--rdzv-id", "r1",
                              "--rdzv-conf", "is_host=0", "--local-addr", WORKER]
    assert cmd.argv[-3:] == ["train.py", "--lr", "3e-4"]


def test_rendezvous_is_frozen() -> None:
    rdzv = Rendezvous(nnodes=2, node_rank=0, endpoint="h:1", run_id="r", local_addr="h")
    with pytest.raises(AttributeError):
        rdzv.node_rank = 1  # type: ignore[misc]


# ---------------------------------------------------------------- node tags


def test_tag_puts_the_node_in_the_rank_prefix() -> None:
    assert tag("worker1", "[rank3]:loss 1.5") == "[worker1 rank3]:loss 1.5"
    assert tag("head", "elastic agent started") == "[head]: elastic agent started"
    assert tag("head", "") == "[head]: "


@pytest.mark.parametrize(("line", "rank", "text"), [
    ("[worker1 rank3]:text", 3, "text"),
    ("[head rank0]:step 1 loss 2.0", 0, "step 1 loss 2.0"),
    ("[head]: text", None, "text"),
    ("[head rank0]:[rank0]: boom", 0, "boom"),
    ("[worker12 rank95]:[rank95]:Traceback (most recent call last):", 95,
     "Traceback (most recent call last):"),
    ("[worker1 rank3]:[rank4]: other", 3, "[rank4]: other"),
    ("[head]:no space", None, "[head]:no space"),
    ("[worker1 rank3]:", 3, ""),
])
def test_split_line_reads_node_tagged_lines(line: str, rank: int | None, text: str) -> None:
    assert split_line(line) == (rank, text)


@pytest.mark.parametrize(("node", "line", "rank", "text"), [
    ("worker2", "[rank5]:hello", 5, "hello"),
    ("head", "[rank0]:[rank0]: RuntimeError: boom", 0, "RuntimeError: boom"),
    ("worker1", "torchrun: waiting for peers", None, "torchrun: waiting for peers"),
    ("head", "[W socket.cpp:464] [c10d] port busy", None, "[W socket.cpp:464] [c10d] port busy"),
])
def test_tagged_lines_split_back(node: str, line: str, rank: int | None, text: str) -> None:
    assert split_line(tag(node, line)) == (rank, text)


@pytest.mark.parametrize("line", ["[rankings] top 5", "[rank0] no colon"])
def test_agent_lines_that_look_like_a_rank_keep_their_text(line: str) -> None:
    assert split_line(tag("head", line)) == (None, line)


def test_the_jobs_image_travels_to_every_node_with_the_run() -> None:
    p = make_plan(image="nvcr.io/nvidia/pytorch:24.06-py3", pull="never",
                  container_opts=["--cap-add=SYS_PTRACE"], shm_size="8g")
    for n in p["nodes"]:
        c = Container.from_json(n["container"])
        assert c == Container("nvcr.io/nvidia/pytorch:24.06-py3", "never",
                              ("--cap-add=SYS_PTRACE",), "8g", "train-ab12")
        assert n["run"] == "train-ab12-0"
    assert all(n["container"] is None for n in make_plan()["nodes"])
