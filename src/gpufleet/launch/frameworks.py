"""The command, environment and generated config files that run one node of a job through each
framework: torchrun, Accelerate, DeepSpeed, Ray Train or Horovod. Pure: data in, data out.

Every framework gets the same job variables (`GPUFLEET_*`, the layout), so `gpufleet.train`
behaves the same under each; what differs is the launcher and the config it reads:

- torchrun: `python -m torch.distributed.run`, the reference path; with `warm`,
  `python -m gpufleet.launch.warm`: the same launcher, its workers forked from a process that
  has torch imported (launch/warm.py).
- accelerate: `accelerate launch --config_file accelerate.yaml`, the config written from the
  strategy and precision (FSDP2 for fsdp/zero2/zero3, DeepSpeed-free), so a script written with
  `Accelerator()` gets the same setup. Accelerate starts its workers through torchrun.
- deepspeed: torchrun plus `ds_config.json` (ZeRO stage from the strategy, bf16/fp16 from the
  precision); `gpufleet.train.prepare` hands the model to `deepspeed.initialize` with it.
- ray: `python -m gpufleet.launch.ray_train`, a Ray Train `TorchTrainer` that runs the script in
  each worker.
- horovod: `horovodrun -np N -H host:slots`; the workers join a torch.distributed group from
  Horovod's rank variables (unverified here: Horovod does not build on this machine).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.bootstrap import SITE_DIR
from gpufleet.launch.env import device_env
from gpufleet.launch.run_env import worker_env
from gpufleet.launch.torchrun import LOG_PREFIX_TEMPLATE, JobContext, env_changes
from gpufleet.parallelism import Layout
from gpufleet.pool.model import Placement
from gpufleet.spec import JobSpec

ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}
ACCELERATE_PRECISION = {"fp32": "no", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}
RAY_MODULE = "gpufleet.launch.ray_train"


MULTI_NODE_FRAMEWORKS = ("torchrun", "deepspeed")
WARM_FRAMEWORKS = ("torchrun", "deepspeed")  # launched by torchrun: `warm` applies (launch/warm.py)


@dataclass(frozen=True)
class Rendezvous:
    """How the nodes of a multi-node job find each other: torchrun's c10d rendezvous, hosted by
    the head node's agent (`is_host`), with the seed's --nnodes/--node-rank semantics."""

    nnodes: int
    node_rank: int  # 0 is the head, which hosts the rendezvous store
    endpoint: str  # head address:port
    run_id: str
    local_addr: str  # this node's address, which the other nodes reach it by


@dataclass(frozen=True)
class NodeCommand:
    argv: list[str]
    env: dict[str, str]  # only what gpufleet adds; the caller layers it over the base env
    files: dict[str, str] = field(default_factory=dict)  # name in the job folder -> content

    def shell(self) -> str:
        """The command as one line a user could paste (for --dry-run and the job folder)."""
        return shlex.join(self.argv)


# A script's own argument for its batch per worker, in the spellings scripts use (argparse's,
# Megatron's, Hugging Face's TrainingArguments); the first of these found is the micro-batch.
MICRO_BATCH_ARGS = ("micro_batch_size", "train_micro_batch_size_per_gpu",
                    "per_device_train_batch_size", "batch_size")
DEFAULT_MICRO_BATCH = 1  # when the script's arguments do not say; DeepSpeed needs a number


def micro_batch_in(args: list[str]) -> int | None:
    """The samples per worker per step the script's arguments give (`--batch-size 8`,
    `--micro_batch_size=4`; dashes and underscores alike), or None."""
    given: dict[str, str] = {}
    for i, arg in enumerate(args):
        name, eq, value = arg.removeprefix("--").partition("=")
        if arg.startswith("--") and name.replace("-", "_") in MICRO_BATCH_ARGS:
            given.setdefault(name.replace("-", "_"),
                             value if eq else (args[i + 1] if i + 1 < len(args) else ""))
    for name in MICRO_BATCH_ARGS:
        if given.get(name, "").isdigit() and int(given[name]) > 0:
            return int(given[name])
    return None


def with_micro_batch(config: dict[str, Any], micro: int, dp: int) -> dict[str, Any]:
    """`config` with DeepSpeed's three batch numbers agreeing for `micro` samples per worker:
    train_batch_size = micro x gradient_accumulation_steps x data-parallel size, which
    `DeepSpeedConfig` asserts (runtime/config.py, `_batch_assertion`) before any step."""
    accum = int(config.get("gradient_accumulation_steps", 1))
    return {**config, "train_micro_batch_size_per_gpu": micro, "train_batch_size": micro * accum * dp}


def deepspeed_config(layout: Layout, micro_batch: int = DEFAULT_MICRO_BATCH) -> dict[str, Any]:
    """The DeepSpeed JSON for a layout, complete, so a script's own `deepspeed.initialize(
    config=...)` accepts it: the micro-batch from the script's arguments (`micro_batch_in`) or
    DEFAULT_MICRO_BATCH, and the global batch it makes over the layout's data-parallel workers.
    `gpufleet.train.prepare` sets both again from the DataLoader it is given."""
    config: dict[str, Any] = {
        "zero_optimization": {"stage": ZERO_STAGE[layout.data_parallel]},
        "gradient_accumulation_steps": 1,
        # The script's own optimizer (e.g. torch.optim.AdamW) is used, not DeepSpeed's fused one,
        # so no C++ op is compiled and the run matches the other frameworks.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if layout.precision == "bf16-mixed":
        config["bf16"] = {"enabled": True}
    elif layout.precision == "fp16-mixed":
        config["fp16"] = {"enabled": True, "initial_scale_power": 16}
    return with_micro_batch(config, micro_batch, layout.dp)


def accelerate_config(layout: Layout, placement: Placement, nodes: int, rank: int,
                      master: str, port: int) -> dict[str, Any]:
    """An Accelerate config file (the keys `accelerate config` writes) for this layout."""
    on_cpu = all(d.gpu == "cpu" for d in placement.devices)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        # MULTI_GPU is Accelerate's torchrun path; with use_cpu it runs gloo on CPU. (Its
        # MULTI_CPU type wants mpirun/oneCCL for more than one process.)
        "distributed_type": "MULTI_GPU",
        "num_machines": nodes,
        "num_processes": layout.world_size,
        "machine_rank": rank,
        "main_process_ip": master,
        "main_process_port": port,
        "mixed_precision": ACCELERATE_PRECISION[layout.precision],
        "use_cpu": on_cpu,
        "rdzv_backend": "static",
        "same_network": True,
        "debug": False,
    }
    if layout.data_parallel in ("fsdp", "zero2", "zero3") and layout.tp == layout.pp == 1:
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": layout.data_parallel != "zero2",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": False,
            "fsdp_activation_checkpointing": False,
        }
    if not on_cpu:
        config["gpu_ids"] = ",".join(str(d.index) for d in placement.devices)
    return config


def _job_env(layout: Layout, placement: Placement, ctx: JobContext, workers: int,
             bootstrap: bool = True) -> dict[str, str]:
    # The worker bootstrap (gpufleet/bootstrap): progress, health and error records for any
    # script. Off, the variable still says so, so nothing below it arms.
    boot = {"PYTHONPATH": str(SITE_DIR)} if bootstrap else {"GPUFLEET_BOOTSTRAP": "0"}
    devices = device_env(placement, ctx.fabric, ctx.host_cpus, workers)
    if devices["GPUFLEET_DEVICE"] == "cpu":
        # An Accelerator() on a machine without CUDA ignores torchrun's RANK/WORLD_SIZE and runs
        # each rank alone unless told to use the CPU (accelerate/state.py: AcceleratorState reads
        # ACCELERATE_USE_CPU, then PartialState joins a gloo group from torchrun's variables).
        # Set for every CPU job, so an Accelerate script is distributed under any framework;
        # only Accelerate (and Transformers' Trainer, which runs on the CPU here anyway) read it.
        devices["ACCELERATE_USE_CPU"] = "true"
    return {
        **boot,
        **devices,
        **layout.to_env(),
        "GPUFLEET_JOB": ctx.job_name,
        "GPUFLEET_CLUSTER": ctx.cluster_name,
        "GPUFLEET_JOB_DIR": str(ctx.job_dir),
        "GPUFLEET_REPORT_ADDR": ctx.report_addr,
        "PYTHONUNBUFFERED": "1",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": LOG_PREFIX_TEMPLATE,
    }


def _torchrun_argv(spec: JobSpec, ctx: JobContext, workers: int,
                   rdzv: Rendezvous | None = None) -> list[str]:
    # c10d gives each node its rank as it joins (GROUP_RANK in the workers); --node-rank is for
    # static rendezvous only, so it is not passed
    nodes = ["--standalone", "--nnodes", "1"] if rdzv is None else [
        "--nnodes", str(rdzv.nnodes), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", rdzv.endpoint, "--rdzv-id", rdzv.run_id,
        "--rdzv-conf", f"is_host={1 if rdzv.node_rank == 0 else 0}",
        "--local-addr", rdzv.local_addr]
    # warm: torchrun's own launcher whose workers fork from a process with torch imported
    launcher = (["gpufleet.launch.warm", *(["--preload", ",".join(spec.preload)]
                                           if spec.preload else []), "--"]
                if spec.warm else ["torch.distributed.run"])
    return [ctx.python, "-m", *launcher, *nodes, "--nproc-per-node", str(workers),
            "--max-restarts", "0",  # gpufleet's supervisor restarts, from the last checkpoint
            "--log-dir", str(ctx.job_dir / "torchrun"), "--tee", "3",
            spec.script, *spec.args]


def build(spec: JobSpec, layout: Layout, placement: Placement, ctx: JobContext,
          port: int = 29500, rdzv: Rendezvous | None = None) -> NodeCommand:
    """One node's command under the job's framework; `rdzv` for a node of a multi-node job
    (torchrun-launched frameworks only)."""
    workers = spec.workers_per_node or len(placement.devices)
    env = _job_env(layout, placement, ctx, workers, spec.bootstrap)
    python = ctx.python
    if rdzv is not None and spec.framework not in MULTI_NODE_FRAMEWORKS:
        raise ValueError(f"{spec.framework} does not run on several nodes here")
    if spec.framework == "torchrun":
        return NodeCommand(_torchrun_argv(spec, ctx, workers, rdzv), env)
    if spec.framework == "deepspeed":
        path = ctx.job_dir / "ds_config.json"
        env["GPUFLEET_DEEPSPEED_CONFIG"] = str(path)
        micro = micro_batch_in(spec.args) or DEFAULT_MICRO_BATCH
        config_text = json.dumps(deepspeed_config(layout, micro), indent=2) + "\n"
        return NodeCommand(_torchrun_argv(spec, ctx, workers, rdzv), env,
                           {path.name: config_text})
    if spec.framework == "accelerate":
        path = ctx.job_dir / "accelerate.yaml"
        # `use_cpu` in the file is ignored on Accelerate's torchrun path; _job_env sets
        # ACCELERATE_USE_CPU for CPU jobs instead.
        config = accelerate_config(layout, placement, 1, 0, "127.0.0.1", port)
        argv = [python, "-m", "accelerate.commands.launch", "--config_file", str(path),
                "--tee", "3", "--log_dir", str(ctx.job_dir / "torchrun"),
                "--max_restarts", "0", spec.script, *spec.args]
        return NodeCommand(argv, env, {path.name: yaml.safe_dump(config, sort_keys=False)})
    if spec.framework == "ray":
        argv = [python, "-m", RAY_MODULE, "--workers", str(workers),
                "--gpus-per-worker", "0" if env["GPUFLEET_DEVICE"] == "cpu" else "1",
                "--max-restarts", "0", "--storage", str(ctx.job_dir / "ray"),
                "--", spec.script, *spec.args]
        return NodeCommand(argv, env)
    if spec.framework == "horovod":
        # horovodrun starts the workers (HOROVOD_RANK/SIZE/LOCAL_RANK); gpufleet.train.setup()
        # joins them in a torch.distributed group at this address, so strategies work unchanged.
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        argv = ["horovodrun", "-np", str(workers), "-H", f"localhost:{workers}",
                python, spec.script, *spec.args]
        return NodeCommand(argv, env)
    raise ValueError(f"unknown framework {spec.framework}")


def describe(commands: list[tuple[str, NodeCommand]], job_dir: Path,
             caller: Mapping[str, str] | None = None, user: dict[str, str] | None = None) -> str:
    """A plain-text dry run: per node, the command, its environment and each file. With the
    `caller`'s environment (a job on this host, whose supervisor starts from it) and the job's
    own `user` variables, the environment is what the workers get (`run_env.worker_env`, as
    the supervisor builds it), shown where it differs from the caller's; else (another node's
    agent starts it over that node's environment) what gpufleet adds."""
    lines: list[str] = []
    for node, cmd in commands:
        lines.append(f"# node {node}")
        if caller is None:
            lines.append("# environment gpufleet adds (over the node's own):")
            lines.extend(f"{k}={shlex.quote(v)}" for k, v in sorted(cmd.env.items()))
        else:
            changed, dropped = env_changes(caller, worker_env(caller, cmd.env, user or {}))
            lines.append("# environment of the workers, where it differs from this shell's:")
            lines.extend(f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items()))
            if dropped:
                lines.append(f"# not passed on: {' '.join(dropped)}")
            lines.append("# and, set by the supervisor at each start: the run's checkpoint "
                         "folder, control file and report key")
        lines.append("# command:")
        lines.append(cmd.shell())
        for name, content in cmd.files.items():
            lines.append(f"# file {job_dir / name}:")
            lines.extend(content.rstrip("\n").splitlines())
        lines.append("")
    return "\n".join(lines)
