"""An image checked for real on this host: podman runs the probe in the test image, in one made
from it without torch, in one without any Python, and is asked for an image it does not have.

`gpufleet doctor --image` shows the good image's versions (exit 0) and a missing image's row
(exit 1, as any failed doctor check); `lifecycle.submit.check_environment`, what submission runs for
the local pool before anything is reserved, raises the one line (exit 2) for each bad image.
No registry: an image is pulled only from the name `localhost/...`, which nothing serves.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator

import pytest
from fleet_helpers import Fleet
from images import image_or_skip

from gpufleet.errors import ImageError
from gpufleet.launch.container import Container
from gpufleet.lifecycle.submit import check_environment
from gpufleet.spec import JobSpec

DOCTOR = [sys.executable, "-m", "gpufleet.doctor.command"]
MISSING = "localhost/gpufleet-test-none-such:0"
PODMAN_TIMEOUT_S = 300  # a wait on a loaded machine, not a verdict


def test_image() -> str:
    return image_or_skip()


test_image.__test__ = False  # type: ignore[attr-defined]


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=PODMAN_TIMEOUT_S)


def derived(base: str, tag: str, make: list[str]) -> str:
    """`localhost/gpufleet-test-TAG:ID`, made once from `base` by running `make` in it and
    committing the result; the base image's ID in the tag, so a new base makes a new one."""
    ident = podman("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()[:12]
    name = f"localhost/gpufleet-test-{tag}:{ident}"
    if podman("image", "exists", name).returncode == 0:
        return name
    box = f"gpufleet-test-make-{tag}-{os.getpid()}"
    try:
        made = podman("run", "--name", box, base, *make)
        assert made.returncode == 0, made.stderr
        committed = podman("commit", box, name)
        assert committed.returncode == 0, committed.stderr
    finally:
        podman("rm", "-f", box)
    return name


def no_python_image() -> str:
    """An image of one file and no interpreter: `podman import` of a tar made here."""
    name = "localhost/gpufleet-test-nopython:1"
    if podman("image", "exists", name).returncode == 0:
        return name
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        body = b"an image with no Python, for gpufleet's image preflight test\n"
        info = tarfile.TarInfo("README")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    done = subprocess.run(["podman", "import", "-", name], input=data.getvalue(),
                          capture_output=True, timeout=PODMAN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return name


@pytest.fixture(scope="module")
def images() -> Iterator[dict[str, str]]:
    base = test_image()
    # drop torch's package folder (found without importing torch) and commit: one layer
    drop = ("import importlib.util, os, shutil; s = importlib.util.find_spec('torch'); "
            "shutil.rmtree(os.path.dirname(s.origin))")
    started = time.monotonic()
    made = {"good": base, "notorch": derived(base, "notorch", ["python3", "-c", drop]),
            "nopython": no_python_image()}
    print(f"test images ready in {time.monotonic() - started:.1f} s")
    yield made


def doctor(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DOCTOR, *args], env=fleet.env(), cwd=fleet.cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def by_name(r: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    [node] = json.loads(r.stdout)["nodes"]
    return {c["name"]: c for c in node["checks"]}


def test_doctor_shows_a_good_images_python_and_torch(fleet: Fleet, images: dict[str, str]) -> None:
    started = time.monotonic()
    r = doctor(fleet, "--image", images["good"], "--json")
    print(f"doctor --image: {time.monotonic() - started:.1f} s")
    assert r.returncode == 0, r.stdout + r.stderr
    checks = by_name(r)
    assert {n: c["status"] for n, c in checks.items() if n != "memlock"} == {
        "runtime": "pass", "image": "pass", "python": "pass", "torch": "pass", "cuda": "pass",
        "shm": "pass", "gpufleet": "pass"}
    assert re.fullmatch(r"podman \d+\.\d+\.\d+ \(/\S+podman\)", checks["runtime"]["detail"])
    assert re.fullmatch(r"Python 3\.1[1-9]\.\d+ \(/\S+\)", checks["python"]["detail"])
    assert re.fullmatch(r"torch \d+\.\d+\.\d+\S* \((a CPU build|CUDA \d+\.\d+)\)",
                        checks["torch"]["detail"]), checks["torch"]
    # the node's gpufleet, mounted read-only as a job's container gets it, imports inside
    assert checks["gpufleet"]["detail"].startswith("gpufleet, mounted read-only from local, "
                                                   "imports"), checks["gpufleet"]


def test_doctor_on_a_missing_image_with_pull_never(fleet: Fleet) -> None:
    test_image()
    r = doctor(fleet, "--image", MISSING, "--pull", "never", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    checks = by_name(r)
    assert checks["image"]["status"] == "fail"
    assert checks["image"]["detail"] == (f"image {MISSING} is not on local and could not be "
                                         "pulled: --pull never, and it is not there")
    assert "python" not in checks  # nothing was run


def refusal(c: Container) -> str:
    with pytest.raises(ImageError) as err:
        # unvalidated: the spec's own checks would refuse a 64m /dev/shm before the image's
        check_environment(JobSpec.model_construct(
            script="t.py", name="j", image=c.image, pull=c.pull, shm_size=c.shm_size,
            container_opts=list(c.opts)), "local")
    assert err.value.exit_code == 2
    return str(err.value)


def test_submission_refuses_a_missing_image_in_one_line() -> None:
    test_image()
    line = refusal(Container(image=MISSING, pull="never"))
    assert line == (f"image {MISSING} is not on local and could not be pulled: --pull never, "
                    "and it is not there (fix: `podman load -i FILE` on local, or make a "
                    "registry that has it reachable from the node)")
    # pulled when missing: no registry answers here, and the runtime's reason is kept
    line = refusal(Container(image=MISSING, pull="missing"))
    assert line.startswith(f"image {MISSING} is not on local and could not be pulled: ")
    assert "\n" not in line


def test_submission_refuses_an_image_without_torch(images: dict[str, str]) -> None:
    line = refusal(Container(image=images["notorch"]))
    assert line == (f"image {images['notorch']} on local: torch is not installed (install "
                    "torch in the image, or choose an image such as "
                    "nvcr.io/nvidia/pytorch:24.06-py3)")
    # /dev/shm as measured inside: a private one of 64 MiB (below what a spec allows, given
    # here directly to see the probe measure it) is refused with the fix
    line = refusal(Container(image=images["notorch"], shm_size="64m"))
    assert line.endswith(f"; image {images['notorch']} on local: /dev/shm inside is 64 MiB "
                         "(--shm-size 64m); DataLoader workers and NCCL need at least 1.0 GiB "
                         "(run with a larger --shm-size, e.g. --shm-size 8g)"), line


def test_a_docker_client_without_a_daemon_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The docker client here has no daemon: a runtime that does not answer, not a missing
    image."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client")
    monkeypatch.setenv("GPUFLEET_CONTAINER_RUNTIME", "docker")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/gpufleet-test-docker.sock")
    line = refusal(Container(image=MISSING))
    assert re.fullmatch(rf"image {re.escape(MISSING)} on local: docker \S+ \(\S+\) does not "
                        r"answer: .*\(fix: start the runtime's service \(docker: its daemon\).*",
                        line), line


def test_no_python_is_told_apart_from_a_runtime_that_cannot_start(images: dict[str, str]) -> None:
    line = refusal(Container(image=images["nopython"]))
    assert line.startswith(f"image {images['nopython']} on local: python3 is not in the image")
    # an option the runtime refuses: the container never starts, and the runtime says why
    line = refusal(Container(image=images["good"], opts=("--ulimit=bogus=1:1",)))
    assert re.match(rf"image {re.escape(images['good'])} on local: podman \S+ could not start "
                    r"a container: .*bogus", line), line

