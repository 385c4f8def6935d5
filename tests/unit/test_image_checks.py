"""The image checks and the parsing under them: hand-made facts and runtime outputs, no podman.

Each failing check must be one line naming the image, the node and the fix; each verdict is
asserted on both sides of its threshold so a wrong comparison fails here.
"""

from __future__ import annotations

from dataclasses import replace

from gpufleet.backends.image_probe import MARKER, SNIPPET, Probed, ProbeFailed, parse_probe
from gpufleet.backends.runtime import Ran, parse_smi_cuda, parse_version, pull_decision, short_reason
from gpufleet.doctor.image_checks import ImageFacts, failure_line, run_all
from gpufleet.doctor.model import GIB, MIB

GOOD = Probed("/usr/bin/python3", "3.11.2", "2.4.0+cu124", "12.4", 8 * GIB, False)
FACTS = ImageFacts(image="img:1", node="n1", runtime="/usr/bin/podman",
                   runtime_version="podman 4.3.1", runtime_error=None, image_error=None,
                   pulled=False, probe=GOOD, driver_cuda="12.4", memlock=-1, shm_size=None)


def verdicts(f: ImageFacts) -> dict[str, str]:
    return {c.name: c.status for c in run_all(f)}


def failures(f: ImageFacts) -> list[str]:
    return [failure_line(f, c) for c in run_all(f) if c.status == "fail"]


def test_a_good_image_passes_every_check_and_shows_versions() -> None:
    checks = {c.name: c for c in run_all(FACTS)}
    assert {n: c.status for n, c in checks.items()} == {
        "runtime": "pass", "image": "pass", "python": "pass", "torch": "pass", "cuda": "pass",
        "shm": "pass", "memlock": "pass", "gpufleet": "pass"}
    assert "torch 2.4.0+cu124 (CUDA 12.4)" in checks["torch"].detail
    assert "Python 3.11.2" in checks["python"].detail


def test_torch_missing_is_one_line_with_the_fix() -> None:
    f = replace(FACTS, probe=replace(GOOD, torch=None, torch_cuda=None,
                                     torch_error="No module named 'torch'"))
    assert failures(f) == ["image img:1 on n1: torch is not installed (install torch in the "
                           "image, or choose an image such as nvcr.io/nvidia/pytorch:24.06-py3)"]


def test_torch_that_does_not_import_says_why() -> None:
    f = replace(FACTS, probe=replace(GOOD, torch=None, torch_error="OSError: libcudnn.so.9"))
    [line] = failures(f)
    assert "torch does not import (OSError: libcudnn.so.9)" in line


def test_python_older_than_3_11_fails_and_3_11_passes() -> None:
    assert verdicts(replace(FACTS, probe=replace(GOOD, python_version="3.10.12")))["python"] == "fail"
    assert verdicts(replace(FACTS, probe=replace(GOOD, python_version="3.11.0")))["python"] == "pass"
    assert verdicts(replace(FACTS, probe=replace(GOOD, python_version="3.12.1")))["python"] == "pass"


def test_no_python_in_the_image_is_told_apart_from_a_runtime_that_does_not_start() -> None:
    no_python = replace(FACTS, probe=ProbeFailed("python", "python3 is not in the image (...)"))
    assert verdicts(no_python) == {"runtime": "pass", "image": "pass", "python": "fail",
                                   "memlock": "pass"}
    broken = replace(FACTS, probe=ProbeFailed("start", "error setting rlimit type 7"))
    assert verdicts(broken) == {"runtime": "fail", "image": "pass", "memlock": "pass"}
    [line] = failures(broken)
    assert line.startswith("image img:1 on n1: podman 4.3.1 could not start a container: "
                           "error setting rlimit type 7")


def test_image_cuda_newer_than_the_driver_fails_by_major_minor() -> None:
    newer = replace(FACTS, driver_cuda="12.2")
    [line] = failures(newer)
    assert line == ("image img:1 on n1: the image's CUDA 12.4 (torch 2.4.0+cu124) is newer than "
                    "n1's driver supports (12.2) (choose an image built for CUDA <= 12.2, or "
                    "update the NVIDIA driver on n1)")
    assert verdicts(replace(FACTS, driver_cuda="12.10"))["cuda"] == "pass"  # 10 > 4, not "1" < "4"
    assert verdicts(replace(FACTS, driver_cuda="11.8"))["cuda"] == "fail"
    assert verdicts(replace(FACTS, driver_cuda=None))["cuda"] == "pass"  # no driver to compare
    cpu = replace(FACTS, probe=replace(GOOD, torch="2.4.0+cpu", torch_cuda=None), driver_cuda="11.0")
    assert verdicts(cpu)["cuda"] == "pass"


def test_shm_under_1_gib_fails_and_the_fix_names_shm_size() -> None:
    small = replace(FACTS, probe=replace(GOOD, shm_bytes=64 * MIB))
    [line] = failures(small)
    assert "/dev/shm inside is 64 MiB (the host's, with --ipc host)" in line
    assert "--shm-size 8g" in line
    assert verdicts(replace(FACTS, probe=replace(GOOD, shm_bytes=GIB)))["shm"] == "pass"
    asked = replace(small, shm_size="64m")
    assert "(--shm-size 64m)" in failures(asked)[0]


def test_a_missing_image_is_one_line_naming_the_image_the_node_and_the_reason() -> None:
    f = replace(FACTS, image_error="connection refused", probe=None)
    assert failures(f) == ["image img:1 is not on n1 and could not be pulled: connection "
                           "refused (fix: `podman load -i FILE` on n1, or make a registry that "
                           "has it reachable from the node)"]


def test_no_runtime_is_the_only_failure() -> None:
    f = replace(FACTS, runtime=None, runtime_version=None, probe=None,
                runtime_error="no container runtime: neither podman nor docker is on PATH")
    assert verdicts(f) == {"runtime": "fail"}
    assert "GPUFLEET_CONTAINER_RUNTIME" in failures(f)[0]


def test_a_limited_memlock_is_a_warning_not_a_failure() -> None:
    f = replace(FACTS, memlock=8 * MIB)
    assert verdicts(f)["memlock"] == "warn"
    assert failures(f) == []


# -- parsing --------------------------------------------------------------------------------------
def test_parse_version_of_podman_and_docker() -> None:
    assert parse_version("podman version 4.3.1\n") == ("podman", "4.3.1")
    assert parse_version("Docker version 24.0.7, build afdd53b") == ("docker", "24.0.7")
    assert parse_version("bash: podman: command not found") is None


def test_short_reason_keeps_the_runtimes_error_line() -> None:
    ran = Ran(125, "", "Trying to pull localhost/x:1...\nError: initializing source: connection "
              "refused\n")
    assert short_reason(ran, 60) == "initializing source: connection refused"
    assert short_reason(Ran(None, "", ""), 60) == "no answer in 60 s"
    assert len(short_reason(Ran(1, "", "Error: " + "x" * 5000), 60)) <= 200


def test_pull_policies() -> None:
    assert [pull_decision(p, True) for p in ("never", "missing", "always")] == ["use", "use", "pull"]
    assert [pull_decision(p, False) for p in ("never", "missing", "always")] == [
        "refuse", "pull", "pull"]


def test_nvidia_smi_header() -> None:
    header = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |"
    assert parse_smi_cuda(header) == "12.4"
    assert parse_smi_cuda("NVIDIA-SMI has failed") is None


def test_parse_probe_reads_the_marker_line_after_an_entrypoint_banner() -> None:
    out = ("== PyTorch ==\nNVIDIA Release 24.06\n" + MARKER + '{"python": "/usr/bin/python3", '
           '"python_version": "3.10.12", "torch": "2.4.0a0", "torch_cuda": "12.5", '
           '"shm_bytes": 67108864, "gpufleet": false}\n')
    assert parse_probe(0, out, "") == Probed("/usr/bin/python3", "3.10.12", "2.4.0a0", "12.5",
                                             64 * MIB, False)


def test_parse_probe_tells_the_failures_apart() -> None:
    podman_127 = ('Error: runc: runc create failed: unable to start container process: exec: '
                  '"python3": executable file not found in $PATH: OCI runtime attempted to invoke '
                  'a command that was not found\n')
    no_python = parse_probe(127, "", podman_127)
    assert isinstance(no_python, ProbeFailed) and no_python.kind == "python"
    assert no_python.reason.startswith("python3 is not in the image")
    refused = parse_probe(126, "", "Error: runc: runc create failed: error setting rlimit type "
                          "7: operation not permitted: OCI permission denied\n")
    assert refused == ProbeFailed("start", "runc: runc create failed: error setting rlimit type "
                                  "7: operation not permitted: OCI permission denied")
    daemon = parse_probe(125, "", "docker: Cannot connect to the Docker daemon at "
                         "unix:///var/run/docker.sock. Is the docker daemon running?\n")
    assert isinstance(daemon, ProbeFailed) and daemon.kind == "start"
    assert "Cannot connect to the Docker daemon" in daemon.reason
    old = parse_probe(1, "", '  File "<string>", line 2\nSyntaxError: invalid syntax\n')
    assert old == ProbeFailed("python", "python3 could not run the probe: SyntaxError: invalid "
                              "syntax")
    assert parse_probe(None, "", "", 120) == ProbeFailed("start", "no answer in 120 s")


def test_the_snippet_is_compiled_by_this_python_and_prints_its_marker() -> None:
    compile(SNIPPET, "<probe>", "exec")
    assert repr(MARKER) in SNIPPET


def test_doctor_flags_are_validated_naming_each_field() -> None:
    import pytest

    from gpufleet.doctor.command import container_of
    from gpufleet.errors import SpecError

    with pytest.raises(SpecError) as err:
        container_of("img:1", pull="sometimes", shm_size="lots")
    assert [f for f, _ in err.value.problems] == ["pull", "shm_size"]
    assert "never, missing or always" in str(err.value)
    assert container_of("img:1", "never", "8g", ("--cap-add=SYS_PTRACE",)).shm_size == "8g"
    with pytest.raises(SpecError) as err:
        container_of("img:1", opts=("--network=bridge",))
    assert [f for f, _ in err.value.problems] == ["container_opt"]


def test_check_at_submission_leaves_other_pools_images_to_their_nodes() -> None:
    from gpufleet.lifecycle.submit import check_environment
    from gpufleet.spec import JobSpec

    # a pool whose nodes are not this machine: nothing is asked here (a runtime call would
    # fail: this image does not exist anywhere)
    for kind in ("ssh", "slurm", "ray"):
        check_environment(JobSpec(script="t.py", image="localhost/none-such:0", pull="never"),
                          kind)
    check_environment(JobSpec(script="t.py"), "local")  # torch is importable here


def test_doctor_image_with_a_cluster_says_which_nodes_it_did_not_check() -> None:
    from gpufleet.doctor.command import image_reports
    from gpufleet.doctor.model import Target
    from gpufleet.launch.container import Container
    from gpufleet.pool.model import Node

    here = Node(id="local", address="127.0.0.1", devices=())
    far = Target(node="n2", cluster="c1", gpu="cpu", network="ethernet", devices=())
    [report] = image_reports(Container(image="img:1"), [far], here)  # nothing runs for n2
    [row] = report.checks
    assert (report.node, row.name, row.status) == ("n2", "image", "warn")
    assert row.fix == "run `gpufleet doctor --image img:1` on n2"
