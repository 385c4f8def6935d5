"""The runtime's command for a launcher in an image (launch/container.py): what a distributed
job needs is always there, values stay off the command line, paths stay true inside, and the
options gpufleet sets cannot be given twice."""

from __future__ import annotations

from gpufleet.launch.container import (
    Container,
    NodeSide,
    inside_env,
    job_mounts,
    leftovers_argv,
    name_of,
    opt_problems,
    wrap,
)

PKG = "/opt/venv/lib/python3.11/site-packages/gpufleet"
SITE = f"{PKG}/bootstrap/site"


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin", "HOME": "/home/u", "GPUFLEET_JOB_DIR": "/home/u/.gpufleet/jobs/j1",
            "GPUFLEET_REPORT_KEY": "s3cret", "PYTHONPATH": f"{SITE}:/home/u/venv/lib",
            "CONTAINERS_CONF": "/etc/t.conf", **extra}


def _wrap(c: Container, env: dict[str, str], flavor: str = "podman"):  # type: ignore[no-untyped-def]
    node = NodeSide(runtime=f"/usr/bin/{flavor}", flavor=flavor, memlock=8 << 20)  # type: ignore[arg-type]
    return wrap(c, node, ["/host/python", "-m", "torch.distributed.run", "train.py"], env,
                "/srv/proj", PKG, "head", "r3")


def test_the_launcher_runs_in_the_image_with_what_distributed_training_needs() -> None:
    w = _wrap(Container(image="nvcr.io/nvidia/pytorch:24.06-py3", job="j1"),
              _env(CUDA_VISIBLE_DEVICES="2,5"))
    a = w.argv
    assert a[:2] == ["/usr/bin/podman", "run"]
    i = a.index("nvcr.io/nvidia/pytorch:24.06-py3")
    assert a[i + 1:] == ["python3", "-m", "torch.distributed.run", "train.py"]
    opts = " ".join(a[:i])
    for want in ("--network host", "--pid host", "--uts host", "--ipc host", "--rm",
                 "--ulimit memlock=8388608:8388608", "--ulimit stack=67108864:67108864",
                 "--device nvidia.com/gpu=2 --device nvidia.com/gpu=5", "--workdir /srv/proj",
                 "--label gpufleet.job=j1", "--pull missing", f"-v {PKG}:{PKG}:ro",
                 "-v /srv/proj:/srv/proj", "-v /home/u/.gpufleet/jobs/j1:/home/u/.gpufleet/jobs/j1"):
        assert want in opts, want
    assert "--hostname" not in opts
    assert w.env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the runtime shows only the two, from 0
    assert w.cleanup == ["/usr/bin/podman", "rm", "-f", w.name]
    assert w.name == "gpufleet-j1-head-r3"


def test_values_never_reach_the_command_line_and_host_variables_stay_outside() -> None:
    w = _wrap(Container(image="img", job="j1"), _env())
    assert "s3cret" not in " ".join(w.argv)
    names = [w.argv[i + 1] for i, x in enumerate(w.argv) if x == "--env"]
    assert "GPUFLEET_REPORT_KEY" in names and "PYTHONPATH" in names
    assert not {"PATH", "HOME", "CONTAINERS_CONF"} & set(names)
    assert w.env["GPUFLEET_REPORT_KEY"] == "s3cret"  # the runtime process passes it by name
    # the host's venv is not inside; the bootstrap (mounted) and gpufleet's parent are
    assert w.env["PYTHONPATH"] == f"{SITE}:{PKG.rpartition('/')[0]}"


def test_a_private_shm_replaces_the_hosts_ipc_and_docker_gets_its_own_device_words() -> None:
    w = _wrap(Container(image="img", shm_size="8g"), _env(CUDA_VISIBLE_DEVICES="0,1"), "docker")
    opts = " ".join(w.argv)
    assert "--shm-size 8g" in opts and "--ipc" not in opts
    assert '--gpus "device=0,1"' in opts and "nvidia.com/gpu" not in opts


def test_a_cpu_run_gets_no_devices() -> None:
    w = _wrap(Container(image="img"), _env(CUDA_VISIBLE_DEVICES=""))
    assert "--device" not in w.argv and "--gpus" not in w.argv


def test_options_gpufleet_sets_are_refused_by_any_spelling_and_others_pass() -> None:
    assert opt_problems(["--cap-add=SYS_PTRACE", "--ulimit nofile=1024:1024", "-v /data:/data"]) == []
    for bad in ("--network=bridge", "--net bridge", "--hostname x", "-h x", "--ipc private",
                "--gpus all", "--ulimit memlock=1:1", "--ulimit=stack=1:1", "-e A=b", "--name x"):
        problems = opt_problems([bad])
        assert problems and problems[0][0] == "container_opt", bad
        assert "set by gpufleet" in problems[0][1], bad
    assert "not an option" in opt_problems(["bridge"])[0][1]


def test_mounts_are_each_folder_once_and_a_local_checkpoint_folder_is_one() -> None:
    env = {"GPUFLEET_JOB_DIR": "/w/jobs/j", "GPUFLEET_CHECKPOINT_TO": "/mnt/ckpt/"}
    paths = [m.path for m in job_mounts(env, "/w/jobs/j", PKG)]
    assert paths == ["/w/jobs/j", "/mnt/ckpt", PKG]
    assert [m.path for m in job_mounts({"GPUFLEET_CHECKPOINT_TO": "s3://b/x"}, "/w", PKG)] == ["/w", PKG]


def test_names_labels_and_what_leftovers_are_found_by() -> None:
    c = Container(image="img", job="my job")
    assert name_of(c, "worker1", "r1") == "gpufleet-my-job-worker1-r1"
    node = NodeSide(runtime="podman", flavor="podman")
    assert leftovers_argv(node, "j9")[-2:] == ["--filter", "label=gpufleet.job=j9"]
    assert Container.from_json(c.to_json()) == c
    assert inside_env({"A": "1", "BAD-NAME": "2", "SSH_AUTH_SOCK": "x"}) == ["A"]
