"""Each framework's node command: argv, the layout variables, generated configs (ds_config.json,
accelerate.yaml), the dry-run text, and the Ray driver's per-rank line prefix."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from placements import JOB_DIR, PY, cpu_placement, ctx, gpu_placement

from gpufleet.bootstrap import SITE_DIR
from gpufleet.launch.frameworks import (
    ACCELERATE_PRECISION,
    DEFAULT_MICRO_BATCH,
    ZERO_STAGE,
    NodeCommand,
    accelerate_config,
    build,
    deepspeed_config,
    describe,
    micro_batch_in,
    with_micro_batch,
)
from gpufleet.launch.ray_train import _RankPrefix
from gpufleet.launch.run_env import worker_env
from gpufleet.parallelism import Layout, resolve
from gpufleet.pool.model import Placement
from gpufleet.spec import JobSpec
from gpufleet.supervise.logs import split_line

FRAMEWORKS = ("torchrun", "accelerate", "deepspeed", "ray", "horovod")
LAYOUT_KEYS = ("GPUFLEET_STRATEGY", "GPUFLEET_DATA_PARALLEL", "GPUFLEET_MESH", "GPUFLEET_PRECISION",
               "GPUFLEET_FRAMEWORK", "GPUFLEET_PP_SCHEDULE", "GPUFLEET_MICROBATCHES")
# Arguments a shell would split, expand or run; each must stay one argv item.
NASTY = ["--name", "two words", "it's", '"double"', "a; rm -rf /", "$(whoami)", "`id`", "&&", ""]


def spec(framework: str = "torchrun", **fields: Any) -> JobSpec:
    return JobSpec(script=fields.pop("script", "train.py"), framework=framework, **fields)


def node(framework: str = "torchrun", placement: Placement | None = None, **fields: Any) -> NodeCommand:
    """One node's command, with the layout resolved from the spec on the placement's workers."""
    placement = placement or cpu_placement(2)
    s = spec(framework, **fields)
    world = s.workers_per_node or len(placement.devices)
    return build(s, s.layout(world), placement, ctx(), port=29611)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def layout(strategy: str = "ddp", world: int = 2, **kw: Any) -> Layout:
    return resolve(strategy, world, **kw)


def ds_json(cmd: NodeCommand) -> dict[str, Any]:
    assert set(cmd.files) == {"ds_config.json"}, cmd.files
    data: dict[str, Any] = json.loads(cmd.files["ds_config.json"])
    return data


def accel_yaml(cmd: NodeCommand) -> dict[str, Any]:
    assert set(cmd.files) == {"accelerate.yaml"}, cmd.files
    data: dict[str, Any] = yaml.safe_load(cmd.files["accelerate.yaml"])
    return data


# ---------------------------------------------------------------- the layout variables


def test_torchrun_fsdp_env_carries_the_layout() -> None:
    cmd = node("torchrun", strategy="fsdp", precision="bf16-mixed")
    assert cmd.argv[:4] == [PY, "-m", "gpufleet.launch.warm", "--"]  # warm by default
    assert flag(cmd.argv, "--nproc-per-node") == "2"
    assert cmd.env["GPUFLEET_STRATEGY"] == "fsdp"
    assert cmd.env["GPUFLEET_DATA_PARALLEL"] == "fsdp"
    assert cmd.env["GPUFLEET_MESH"] == "dp=2,tp=1,pp=1"
    assert cmd.env["GPUFLEET_PRECISION"] == "bf16-mixed"
    assert cmd.env["GPUFLEET_FRAMEWORK"] == "torchrun"
    assert cmd.env["GPUFLEET_PP_SCHEDULE"] == "1f1b"
    assert cmd.env["GPUFLEET_MICROBATCHES"] == "1"
    assert cmd.files == {}


@pytest.mark.parametrize(("strategy", "kw", "data_parallel"), [
    ("fsdp", {"tp": 2}, "fsdp"),  # fsdp fills dp = 4 / tp
    ("tp", {"dp": 2}, "ddp"),  # tp fills tp = 4 / dp
])
def test_dp2_tp2_mesh_in_env(strategy: str, kw: dict[str, int], data_parallel: str) -> None:
    cmd = node("torchrun", gpu_placement([0, 1, 2, 3]), strategy=strategy, **kw)
    assert cmd.env["GPUFLEET_MESH"] == "dp=2,tp=2,pp=1"
    assert cmd.env["GPUFLEET_STRATEGY"] == strategy
    assert cmd.env["GPUFLEET_DATA_PARALLEL"] == data_parallel
    assert flag(cmd.argv, "--nproc-per-node") == "4"


def test_pipeline_schedule_and_microbatches_in_env() -> None:
    cmd = node("torchrun", cpu_placement(4), strategy="pp", pp_schedule="gpipe", microbatches=8)
    assert cmd.env["GPUFLEET_MESH"] == "dp=1,tp=1,pp=4"
    assert cmd.env["GPUFLEET_PP_SCHEDULE"] == "gpipe"
    assert cmd.env["GPUFLEET_MICROBATCHES"] == "8"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_framework_gets_the_same_layout_and_job_variables(framework: str) -> None:
    cmd = node(framework, strategy="ddp", precision="bf16-mixed")
    reference = node("torchrun", strategy="ddp", precision="bf16-mixed")
    for key in LAYOUT_KEYS:
        assert key in cmd.env, key
        if key != "GPUFLEET_FRAMEWORK":
            assert cmd.env[key] == reference.env[key], key
    assert cmd.env["GPUFLEET_FRAMEWORK"] == framework
    assert cmd.env["GPUFLEET_JOB"] == "train-ab12"
    assert cmd.env["GPUFLEET_CLUSTER"] == "llama"
    assert cmd.env["GPUFLEET_JOB_DIR"] == str(JOB_DIR)
    assert cmd.env["GPUFLEET_REPORT_ADDR"] == "127.0.0.1:5555"
    assert cmd.env["GPUFLEET_DEVICE"] == "cpu"
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == ""
    assert cmd.env["PYTHONUNBUFFERED"] == "1"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in cmd.env.items())
    assert all(isinstance(a, str) for a in cmd.argv)


def test_layout_env_is_from_the_layout_passed_not_the_spec() -> None:
    # `build` is given the resolved layout; it must not re-derive one from the spec
    s = spec("torchrun", strategy="ddp")
    lay = resolve("zero3", 2, precision="bf16-mixed", framework="torchrun")
    cmd = build(s, lay, cpu_placement(2), ctx())
    assert cmd.env["GPUFLEET_STRATEGY"] == "zero3"
    assert cmd.env["GPUFLEET_PRECISION"] == "bf16-mixed"


# ---------------------------------------------------------------- deepspeed


def test_deepspeed_runs_torchrun_with_a_config_in_the_job_folder() -> None:
    cmd = node("deepspeed", strategy="zero2", args=["--steps", "3"])
    assert cmd.argv[:4] == [PY, "-m", "gpufleet.launch.warm", "--"]  # torchrun's own, warm
    assert "--standalone" in cmd.argv
    assert flag(cmd.argv, "--nproc-per-node") == "2"
    assert cmd.argv[-3:] == ["train.py", "--steps", "3"]
    path = Path(cmd.env["GPUFLEET_DEEPSPEED_CONFIG"])
    assert path == JOB_DIR / "ds_config.json"
    assert path.parent == JOB_DIR
    assert set(cmd.files) == {path.name}
    assert cmd.files[path.name].endswith("\n")


@pytest.mark.parametrize(("strategy", "stage"),
                         [("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3), ("fsdp", 3)])
def test_deepspeed_zero_stage_per_strategy(strategy: str, stage: int) -> None:
    assert ZERO_STAGE[strategy] == stage
    config = ds_json(node("deepspeed", strategy=strategy))
    assert config["zero_optimization"]["stage"] == stage
    assert deepspeed_config(layout(strategy))["zero_optimization"]["stage"] == stage


@pytest.mark.parametrize(("precision", "bf16", "fp16"), [
    ("bf16-mixed", True, False), ("fp16-mixed", False, True), ("fp32", False, False),
])
def test_deepspeed_precision_sections(precision: str, bf16: bool, fp16: bool) -> None:
    config = ds_json(node("deepspeed", gpu_placement([0, 1]), strategy="zero1", precision=precision))
    if bf16:
        assert config["bf16"] == {"enabled": True}
    else:
        assert "bf16" not in config
    if fp16:
        assert config["fp16"]["enabled"] is True
    else:
        assert "fp16" not in config


def ds_batches(config: dict[str, Any]) -> tuple[int, int, int]:
    return (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"],
            config["train_batch_size"])


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_deepspeed_config_holds_batch_sizes_that_agree(strategy: str) -> None:
    """DeepSpeed refuses a config without train_batch_size or train_micro_batch_size_per_gpu,
    and one where train_batch_size != micro x accumulation x data-parallel workers."""
    for precision in ("fp32", "bf16-mixed", "fp16-mixed"):
        for world in (1, 2, 4):
            config = deepspeed_config(layout(strategy, world, precision=precision))
            assert ds_batches(config) == (DEFAULT_MICRO_BATCH, 1, DEFAULT_MICRO_BATCH * world)
            assert json.loads(json.dumps(config)) == config  # plain JSON types only
    assert ds_batches(deepspeed_config(layout(strategy, 4), micro_batch=6)) == (6, 1, 24)


@pytest.mark.parametrize(("args", "micro"), [
    (["--batch-size", "8"], 8),
    (["--batch_size=12"], 12),
    (["--per_device_train_batch_size", "3", "--lr", "1e-3"], 3),
    (["--batch-size", "32", "--micro-batch-size", "4"], 4),  # the micro-batch wins over a batch
    (["--micro_batch_size=4", "--batch-size", "32"], 4),
    (["--train-micro-batch-size-per-gpu", "2"], 2),
    (["--batch-size"], None), (["--batch-size", "0"], None), (["--batch-size", "big"], None),
    (["--global-batch-size", "64"], None), (["batch_size", "8"], None), ([], None),
])
def test_micro_batch_read_from_the_scripts_arguments(args: list[str], micro: int | None) -> None:
    assert micro_batch_in(args) == micro


def test_deepspeed_file_takes_the_micro_batch_from_the_job() -> None:
    cmd = node("deepspeed", cpu_placement(4), strategy="zero2", args=["--steps", "3", "--batch-size", "5"])
    assert ds_batches(ds_json(cmd)) == (5, 1, 20)  # 5 per worker on 4 data-parallel workers
    assert ds_batches(ds_json(node("deepspeed", cpu_placement(2), args=["--steps", "3"]))) == (
        DEFAULT_MICRO_BATCH, 1, 2 * DEFAULT_MICRO_BATCH)  # the script does not say: the default
    # fewer workers than devices: the data-parallel size is the workers'
    one = node("deepspeed", cpu_placement(2), workers_per_node=1, args=["--batch-size", "5"])
    assert ds_batches(ds_json(one)) == (5, 1, 5)


def test_prepare_sets_the_loaders_batch_and_keeps_them_agreeing() -> None:
    config = deepspeed_config(layout("zero1", 4), micro_batch=5)
    again = with_micro_batch({**config, "gradient_accumulation_steps": 3}, 8, 4)
    assert ds_batches(again) == (8, 3, 96)
    assert again["zero_optimization"] == config["zero_optimization"]


def test_deepspeed_file_is_the_config_of_the_layout() -> None:
    lay = layout("zero3", precision="bf16-mixed", framework="deepspeed")
    cmd = build(spec("deepspeed", strategy="zero3", precision="bf16-mixed"), lay, cpu_placement(2), ctx())
    assert ds_json(cmd) == deepspeed_config(lay)


# ---------------------------------------------------------------- accelerate


def test_accelerate_argv_launches_the_config_then_the_script() -> None:
    cmd = node("accelerate", strategy="ddp", script="my dir/train.py", args=["--lr", "1e-3"])
    config_path = str(JOB_DIR / "accelerate.yaml")
    assert cmd.argv[:5] == [PY, "-m", "accelerate.commands.launch", "--config_file", config_path]
    assert cmd.argv[-3:] == ["my dir/train.py", "--lr", "1e-3"]
    assert cmd.argv.index("--config_file") < cmd.argv.index("my dir/train.py")
    # its workers' logs go where torchrun's do, in the job folder
    assert flag(cmd.argv, "--log_dir") == str(JOB_DIR / "torchrun")
    assert "accelerate.yaml" in cmd.files
    assert "GPUFLEET_DEEPSPEED_CONFIG" not in cmd.env


@pytest.mark.parametrize("world", [1, 2, 4])
def test_accelerate_num_processes_is_the_world_size(world: int) -> None:
    config = accel_yaml(node("accelerate", cpu_placement(world)))
    assert config["num_processes"] == world
    assert config["num_machines"] == 1
    assert config["machine_rank"] == 0
    assert config["main_process_ip"] == "127.0.0.1"
    assert config["main_process_port"] == 29611


@pytest.mark.parametrize(("precision", "mixed"), [("fp32", "no"), ("bf16-mixed", "bf16"),
                                                   ("fp16-mixed", "fp16")])
def test_accelerate_mixed_precision(precision: str, mixed: str) -> None:
    assert ACCELERATE_PRECISION[precision] == mixed
    config = accel_yaml(node("accelerate", gpu_placement([0, 1]), precision=precision))
    # a string in YAML, not the boolean False that an unquoted `no` would read as
    assert config["mixed_precision"] == mixed


def test_accelerate_on_cpu_uses_cpu_and_names_no_gpus() -> None:
    config = accel_yaml(node("accelerate", cpu_placement(2)))
    assert config["use_cpu"] is True
    assert "gpu_ids" not in config


@pytest.mark.parametrize(("indices", "ids"), [([0, 1], "0,1"), ([2, 3, 5], "2,3,5")])
def test_accelerate_on_gpus_names_the_placements_gpus(indices: list[int], ids: str) -> None:
    config = accel_yaml(node("accelerate", gpu_placement(indices)))
    assert config["use_cpu"] is False
    assert config["gpu_ids"] == ids
    assert config["num_processes"] == len(indices)


@pytest.mark.parametrize(("strategy", "reshard"), [("zero2", False), ("zero3", True), ("fsdp", True)])
def test_accelerate_sharded_strategies_use_fsdp2(strategy: str, reshard: bool) -> None:
    config = accel_yaml(node("accelerate", strategy=strategy))
    assert config["distributed_type"] == "FSDP"
    assert config["fsdp_config"]["fsdp_version"] == 2
    assert config["fsdp_config"]["fsdp_reshard_after_forward"] is reshard


@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_accelerate_replicating_strategies_are_multi_gpu(strategy: str) -> None:
    config = accel_yaml(node("accelerate", strategy=strategy))
    assert config["distributed_type"] == "MULTI_GPU"
    assert "fsdp_config" not in config


def test_accelerate_fsdp_with_a_mesh_is_left_to_prepare() -> None:
    config = accelerate_config(resolve("fsdp", 4, tp=2), gpu_placement([0, 1, 2, 3]), 1, 0,
                               "127.0.0.1", 29500)
    assert config["distributed_type"] == "MULTI_GPU"
    assert "fsdp_config" not in config


# ---------------------------------------------------------------- ray and horovod


@pytest.mark.parametrize(("placement", "gpus"), [(cpu_placement(2), "0"), (gpu_placement([0, 1]), "1")])
def test_ray_argv_runs_the_driver_module(placement: Placement, gpus: str) -> None:
    cmd = node("ray", placement, args=["--steps", "5"], max_restarts=2)
    assert cmd.argv[:3] == [PY, "-m", "gpufleet.launch.ray_train"]
    assert flag(cmd.argv, "--workers") == "2"
    assert flag(cmd.argv, "--gpus-per-worker") == gpus
    assert flag(cmd.argv, "--max-restarts") == "0"  # the supervisor restarts, not Ray
    assert flag(cmd.argv, "--storage") == str(JOB_DIR / "ray")
    sep = cmd.argv.index("--")
    assert cmd.argv[sep + 1:] == ["train.py", "--steps", "5"]
    assert cmd.files == {}


def test_ray_workers_follow_workers_per_node() -> None:
    cmd = node("ray", cpu_placement(4), workers_per_node=3)
    assert flag(cmd.argv, "--workers") == "3"
    assert cmd.env["GPUFLEET_MESH"] == "dp=3,tp=1,pp=1"


def test_ray_driver_parses_the_argv_gpufleet_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's own parser reads back what `build` wrote (stopped before Ray starts)."""
    import argparse

    from gpufleet.launch import ray_train

    class Parsed(Exception):
        pass

    original = argparse.ArgumentParser.parse_args
    seen: list[argparse.Namespace] = []

    def capture(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        seen.append(original(self, args, namespace))
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    cmd = node("ray", script="my dir/train.py", args=NASTY)
    with pytest.raises(Parsed):
        ray_train.main(cmd.argv[3:])
    [ns] = seen
    assert ns.workers == 2
    assert ns.gpus_per_worker == 0
    assert ns.storage == str(JOB_DIR / "ray")
    assert ns.script == "my dir/train.py"
    assert list(ns.args) == NASTY


@pytest.mark.parametrize("n", [1, 2, 4])
def test_horovod_argv(n: int) -> None:
    cmd = node("horovod", cpu_placement(n), args=["--steps", "2"])
    assert cmd.argv[:5] == ["horovodrun", "-np", str(n), "-H", f"localhost:{n}"]
    assert cmd.argv[5:] == [PY, "train.py", "--steps", "2"]
    assert cmd.files == {}


# ---------------------------------------------------------------- argv hygiene, shell(), describe


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_script_args_stay_single_argv_items(framework: str) -> None:
    cmd = node(framework, script="my dir/train.py", args=NASTY)
    assert cmd.argv[-len(NASTY) - 1:] == ["my dir/train.py", *NASTY]
    assert "-c" not in cmd.argv[:3]
    assert not any(a in ("sh", "bash", "/bin/sh", "/bin/bash") for a in cmd.argv)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_shell_round_trips_through_shlex(framework: str) -> None:
    cmd = node(framework, script="my dir/train.py", args=NASTY)
    line = cmd.shell()
    assert "\n" not in line
    assert shlex.split(line) == cmd.argv


def test_node_command_defaults_to_no_files() -> None:
    cmd = NodeCommand(["python", "x.py"], {})
    assert cmd.files == {}
    assert cmd.shell() == "python x.py"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_describe_shows_command_env_and_files(framework: str) -> None:
    cmd = node(framework, strategy="ddp", args=["two words"])
    text = describe([("local", cmd)], JOB_DIR)
    lines = text.splitlines()
    assert "# node local" in lines
    assert cmd.shell() in lines
    for key, value in cmd.env.items():
        assert f"{key}={shlex.quote(value)}" in lines, key
    for name, content in cmd.files.items():
        assert f"# file {JOB_DIR / name}:" in lines
        assert content.rstrip("\n") in text
        for content_line in content.splitlines():
            assert content_line in lines


def test_describe_shows_the_environment_the_workers_get() -> None:
    """With the caller's environment, a dry run shows what `worker_env` (what the supervisor
    starts the workers with) gives, where it differs from the caller's: the caller's own
    PYTHONPATH entries after the bootstrap's, in that order; a tuning value the caller set kept."""
    cmd = node("torchrun")
    caller = {"PYTHONPATH": "/home/me/lib:/opt/shared", "OMP_NUM_THREADS": "4", "HOME": "/home/me",
              "RANK": "3", "GPUFLEET_TOKEN": "secret", "CUDA_VISIBLE_DEVICES": "0"}
    job_env = {"FOO": "two words"}
    lines = describe([("local", cmd)], JOB_DIR, caller, job_env).splitlines()
    shown = dict(shlex.split(line)[0].split("=", 1) for line in lines
                 if line and not line.startswith("#") and line != cmd.shell())
    env = worker_env(caller, cmd.env, job_env)
    assert env["PYTHONPATH"] == f"{SITE_DIR}:/home/me/lib:/opt/shared"
    assert shown["PYTHONPATH"] == env["PYTHONPATH"]
    assert shown == {k: v for k, v in env.items() if caller.get(k) != v}
    assert (shown["FOO"], shown["CUDA_VISIBLE_DEVICES"], env["OMP_NUM_THREADS"]) == ("two words", "", "4")
    assert "OMP_NUM_THREADS" not in shown and "HOME" not in shown  # the workers inherit them
    assert "# not passed on: GPUFLEET_TOKEN RANK" in lines
    # what the caller has, less what is not passed on, plus what is shown: the whole of it
    kept = {k: v for k, v in caller.items() if k not in ("GPUFLEET_TOKEN", "RANK")}
    assert {**kept, **shown} == env


def test_describe_generated_files_parse_back_from_the_text() -> None:
    for framework, name in (("deepspeed", "ds_config.json"), ("accelerate", "accelerate.yaml")):
        cmd = node(framework, strategy="zero2", precision="bf16-mixed")
        text = describe([("local", cmd)], JOB_DIR)
        body = text.split(f"# file {JOB_DIR / name}:\n", 1)[1].split("\n# ", 1)[0]
        parsed = json.loads(body) if name.endswith(".json") else yaml.safe_load(body)
        assert parsed == (ds_json(cmd) if name.endswith(".json") else accel_yaml(cmd))


def test_describe_several_nodes_in_order() -> None:
    a = node("torchrun", args=["a"])
    b = node("deepspeed", args=["b"])
    text = describe([("n0", a), ("n1", b)], JOB_DIR)
    assert text.index("# node n0") < text.index(a.shell()) < text.index("# node n1") \
        < text.index(b.shell())
    assert text.count("# command:") == 2


# ---------------------------------------------------------------- Ray worker output: [rankN]:


def prefixed(rank: int, *pieces: str) -> str:
    inner = io.StringIO()
    stream = _RankPrefix(inner, rank)
    for piece in pieces:
        assert stream.write(piece) == len(piece)
    return inner.getvalue()


def test_rank_prefix_on_whole_lines() -> None:
    assert prefixed(1, "hello\n", "world\n") == "[rank1]:hello\n[rank1]:world\n"


def test_rank_prefix_once_per_line_across_pieces() -> None:
    out = prefixed(3, "a", "b", "c\n", "d")
    assert out == "[rank3]:abc\n[rank3]:d"


def test_rank_prefix_several_lines_in_one_write() -> None:
    assert prefixed(0, "x\ny\n\nz") == "[rank0]:x\n[rank0]:y\n[rank0]:\n[rank0]:z"


def test_rank_prefix_piece_ending_a_line_then_more() -> None:
    assert prefixed(2, "start ", "end\nnext ", "part\n") == "[rank2]:start end\n[rank2]:next part\n"


@pytest.mark.parametrize("pieces", [
    ["a\n", "b\n", "c\n"], ["a", "\n", "b", "\n", "c", "\n"], ["a\nb", "\nc\n"], ["", "a\nb\nc\n", ""],
    ["a", "", "\nb\nc", "\n"],
])
def test_every_line_gets_the_prefix_exactly_once(pieces: list[str]) -> None:
    out = prefixed(7, *pieces)
    lines = out.splitlines()
    assert [ln.removeprefix("[rank7]:") for ln in lines] == ["a", "b", "c"]
    assert all(ln.count("[rank7]:") == 1 and ln.startswith("[rank7]:") for ln in lines)


def test_rank_prefix_empty_write_writes_nothing() -> None:
    assert prefixed(0, "") == ""
    assert prefixed(0, "", "a") == "[rank0]:a"


def test_rank_prefix_lines_split_back_to_rank_and_text() -> None:
    out = prefixed(5, "loss ", "1.5\nstep 2\n")
    assert [split_line(ln) for ln in out.splitlines()] == [(5, "loss 1.5"), (5, "step 2")]


def test_rank_prefix_delegates_flush_and_attributes() -> None:
    class Inner(io.StringIO):
        flushed = 0

        def flush(self) -> None:
            self.flushed += 1
            super().flush()

    inner = Inner()
    stream = _RankPrefix(inner, 0)
    stream.flush()
    assert inner.flushed == 1
    assert stream.getvalue() == ""  # anything else goes to the wrapped stream
    assert stream.closed is False


# ---------------------------------------------------------------- split_line on Ray's tagged lines


@pytest.mark.parametrize(("line", "rank", "text"), [
    ("\x1b[36m(RayTrainWorker pid=123)\x1b[0m [rank1]:hello", 1, "hello"),
    ("(RayTrainWorker pid=5, ip=127.0.0.1) [rank0]:x", 0, "x"),
    ("(RayTrainWorker pid=5) [rank12]:step 3/6 loss 4.388", 12, "step 3/6 loss 4.388"),
    ("\x1b[36m(RayTrainWorker pid=9, ip=10.0.0.2)\x1b[0m [rank3]:[rank3]: Traceback", 3, "Traceback"),
    ("\x1b[36m(RayTrainWorker pid=123)\x1b[0m [rank1]:", 1, ""),
    ("[rank4]:plain torchrun line", 4, "plain torchrun line"),
])
def test_split_line_strips_the_ray_tag(line: str, rank: int, text: str) -> None:
    assert split_line(line) == (rank, text)


@pytest.mark.parametrize(("line", "text"), [
    ("\x1b[36m(TrainController pid=7815)\x1b[0m Requesting resources", "Requesting resources"),
    ("(TrainController pid=7815) Started training worker group of size 2: ",
     "Started training worker group of size 2: "),
    ("2026-01-01 12:00:00,000\tINFO worker.py:2038 -- Started a local Ray instance.",
     "2026-01-01 12:00:00,000\tINFO worker.py:2038 -- Started a local Ray instance."),
])
def test_split_line_ray_lines_without_a_rank_go_to_the_agent(line: str, text: str) -> None:
    assert split_line(line) == (None, text)


def test_split_line_only_strips_one_leading_ray_tag() -> None:
    # a worker that prints something that looks like a tag keeps it in its text
    line = "(RayTrainWorker pid=1) [rank0]:(Fake pid=2) text"
    assert split_line(line) == (0, "(Fake pid=2) text")
