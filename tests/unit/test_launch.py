"""torchrun argv and the environment presets: argument lists, device pinning, precedence."""

from __future__ import annotations

from pathlib import Path

import pytest
from placements import cpu_placement, ctx, gpu_placement

from gpufleet.launch.env import NCCL_BY_FABRIC, device_env
from gpufleet.launch.frameworks import NodeCommand, build
from gpufleet.launch.torchrun import JobContext, merge_env
from gpufleet.pool.model import Placement
from gpufleet.spec import JobSpec


def build_torchrun(spec: JobSpec, placement: Placement, context: JobContext) -> NodeCommand:
    workers = spec.workers_per_node or len(placement.devices)
    return build(spec, spec.layout(workers), placement, context)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# ---------------------------------------------------------------- argv


def test_argv_is_a_list_that_runs_torchrun() -> None:
    cmd = build_torchrun(JobSpec(script="train.py", warm=False), cpu_placement(2), ctx())
    assert isinstance(cmd.argv, list)
    assert all(isinstance(a, str) for a in cmd.argv)
    assert cmd.argv[:3] == ["/venv/bin/python", "-m", "torch.distributed.run"]
    assert "--standalone" in cmd.argv
    assert flag(cmd.argv, "--nnodes") == "1"


def test_nproc_per_node_is_the_device_count() -> None:
    assert flag(build_torchrun(JobSpec(script="t.py"), gpu_placement([0, 1, 2]), ctx()).argv,
                "--nproc-per-node") == "3"
    assert flag(build_torchrun(JobSpec(script="t.py"), cpu_placement(1), ctx()).argv,
                "--nproc-per-node") == "1"


def test_workers_per_node_overrides_device_count() -> None:
    cmd = build_torchrun(JobSpec(script="t.py", workers_per_node=2), cpu_placement(4), ctx())
    assert flag(cmd.argv, "--nproc-per-node") == "2"


def test_restarts_belong_to_the_supervisor_not_torchrun() -> None:
    # torchrun's own restarts would restart from scratch with no record; gpufleet's supervisor
    # restarts from the last checkpoint and records why, so torchrun never restarts itself.
    cmd = build_torchrun(JobSpec(script="t.py", max_restarts=3), cpu_placement(1), ctx())
    assert flag(cmd.argv, "--max-restarts") == "0"


def test_log_dir_under_job_dir() -> None:
    cmd = build_torchrun(JobSpec(script="t.py"), cpu_placement(1), ctx())
    assert flag(cmd.argv, "--log-dir") == str(Path("/state/jobs/train-ab12") / "torchrun")


def test_script_and_args_kept_verbatim_at_the_end() -> None:
    args = ["--name", "a; rm -rf /", "$(whoami)", "two words", "`id`", "'quoted'", "&&", ""]
    cmd = build_torchrun(JobSpec(script="my dir/train.py", args=args), cpu_placement(2), ctx())
    assert cmd.argv[-len(args) - 1:] == ["my dir/train.py", *args]
    # nothing was joined into a shell string
    assert not any(a.startswith(("sh", "bash")) or a == "-c" for a in cmd.argv[:3])


def test_gpufleet_variables_in_env() -> None:
    cmd = build_torchrun(JobSpec(script="t.py"), cpu_placement(2), ctx())
    assert cmd.env["GPUFLEET_JOB"] == "train-ab12"
    assert cmd.env["GPUFLEET_CLUSTER"] == "llama"
    assert cmd.env["GPUFLEET_JOB_DIR"] == "/state/jobs/train-ab12"
    assert cmd.env["GPUFLEET_REPORT_ADDR"] == "127.0.0.1:5555"
    assert cmd.env["GPUFLEET_STRATEGY"] == "ddp"
    assert cmd.env["PYTHONUNBUFFERED"] == "1"
    assert cmd.env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"
    assert all(isinstance(v, str) for v in cmd.env.values())


def test_job_env_is_not_in_gpufleet_layer() -> None:
    # the user's env is layered by merge_env, not baked into the presets
    cmd = build_torchrun(JobSpec(script="t.py", env={"MY_VAR": "1"}), cpu_placement(1), ctx())
    assert "MY_VAR" not in cmd.env


# ---------------------------------------------------------------- device env


def test_cpu_placement_hides_gpus_and_uses_gloo() -> None:
    env = device_env(cpu_placement(2), "pcie", host_cpus=16)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["GPUFLEET_BACKEND"] == "gloo"
    assert env["GPUFLEET_DEVICE"] == "cpu"
    assert not any(k.startswith("NCCL_") for k in env)


@pytest.mark.parametrize(("host_cpus", "workers", "threads"),
                         [(16, 2, 16 // 2), (16, 3, 16 // 3), (2, 4, 1), (1, 1, 1), (8, 8, 8 // 8)])
def test_threads_split_host_cpus_between_workers(host_cpus: int, workers: int, threads: int) -> None:
    env = device_env(cpu_placement(workers), "pcie", host_cpus=host_cpus)
    assert env["OMP_NUM_THREADS"] == str(threads)
    assert env["MKL_NUM_THREADS"] == str(threads)


def test_threads_follow_workers_per_node() -> None:
    cmd = build_torchrun(JobSpec(script="t.py", workers_per_node=4), cpu_placement(2), ctx(host_cpus=8))
    assert flag(cmd.argv, "--nproc-per-node") == "4"
    assert cmd.env["OMP_NUM_THREADS"] == str(8 // 4)


def test_gpu_placement_pins_device_indices_and_uses_nccl() -> None:
    env = device_env(gpu_placement([2, 3, 5]), "pcie", host_cpus=32)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3,5"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUFLEET_BACKEND"] == "nccl"
    assert env["GPUFLEET_DEVICE"] == "cuda"
    assert env["OMP_NUM_THREADS"] == str(32 // 3)
    assert env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_P2P_LEVEL" not in env


@pytest.mark.parametrize("fabric", ["nvlink", "nvswitch"])
def test_nvlink_fabrics_set_p2p_level(fabric: str) -> None:
    assert device_env(gpu_placement([0, 1]), fabric, host_cpus=8)["NCCL_P2P_LEVEL"] == "NVL"


def test_infiniband_enables_ib() -> None:
    env = device_env(gpu_placement([0, 1]), "infiniband", host_cpus=8)
    assert env["NCCL_IB_DISABLE"] == "0"
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"


def test_every_fabric_has_a_preset_that_is_strings() -> None:
    assert set(NCCL_BY_FABRIC) == {"pcie", "nvlink", "nvswitch", "infiniband", "ethernet"}
    for preset in NCCL_BY_FABRIC.values():
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in preset.items())


def test_build_torchrun_on_gpu_placement_carries_device_env() -> None:
    cmd = build_torchrun(JobSpec(script="t.py"), gpu_placement([4, 5]), ctx(fabric="nvswitch", host_cpus=64))
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert cmd.env["NCCL_P2P_LEVEL"] == "NVL"
    assert cmd.env["OMP_NUM_THREADS"] == str(64 // 2)
    assert flag(cmd.argv, "--nproc-per-node") == "2"


# ---------------------------------------------------------------- merge_env precedence


def test_shell_tuning_kept_but_device_pinning_overridden() -> None:
    base = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "3", "NCCL_IB_DISABLE": "0",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
            "GPUFLEET_JOB": "stale", "PYTHONUNBUFFERED": "0"}
    presets = build_torchrun(JobSpec(script="t.py"), gpu_placement([6, 7]), ctx(host_cpus=16)).env
    merged = merge_env(base, presets, {})
    assert merged["PATH"] == "/usr/bin"
    assert merged["OMP_NUM_THREADS"] == "3"  # the user's shell asked for it
    assert merged["NCCL_IB_DISABLE"] == "0"
    assert merged["MKL_NUM_THREADS"] == str(16 // 2)  # not in the shell: preset applies
    assert merged["CUDA_VISIBLE_DEVICES"] == "6,7"  # never the shell's devices
    assert merged["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert merged["GPUFLEET_JOB"] == "train-ab12"
    assert merged["PYTHONUNBUFFERED"] == "1"
    assert merged["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}]:"


def test_shell_cuda_visible_devices_overridden_on_cpu_too() -> None:
    merged = merge_env({"CUDA_VISIBLE_DEVICES": "0"}, device_env(cpu_placement(2), "pcie", 4), {})
    assert merged["CUDA_VISIBLE_DEVICES"] == ""


def test_job_env_wins_over_everything() -> None:
    base = {"OMP_NUM_THREADS": "3", "NCCL_DEBUG": "WARN"}
    presets = {"OMP_NUM_THREADS": "8", "CUDA_VISIBLE_DEVICES": "0", "GPUFLEET_BACKEND": "nccl"}
    user = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "1", "NCCL_DEBUG": "INFO"}
    merged = merge_env(base, presets, user)
    assert merged == {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "1", "NCCL_DEBUG": "INFO",
                      "GPUFLEET_BACKEND": "nccl"}


def test_merge_env_does_not_mutate_inputs() -> None:
    base, presets, user = {"A": "1"}, {"B": "2"}, {"C": "3"}
    merge_env(base, presets, user)
    assert (base, presets, user) == ({"A": "1"}, {"B": "2"}, {"C": "3"})
