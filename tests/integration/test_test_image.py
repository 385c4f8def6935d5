"""The test image (`scripts/test-image`) and the test-only podman settings are what every
`--image` test relies on.

On this host (CONTAINERS_CONF, as the local pool's tests have it): the image runs under podman
and imports the .venv's torch, and it has no gpufleet (gpufleet's worker side is mounted from
the node at run time, so an image needs only Python and torch). `build` again finds it and
prints the same name. On a test machine, over ssh as a job reaches it, with no environment
variable: podman uses the test settings (runc) from the machine's own /etc/containers and its
own image store, which holds the image after `load` and shares no tag with this host's or
another machine's store. A step of the test Slurm (on this host) gets them through srun's
environment.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import uuid

import pytest
from images import SCRIPT, image_or_skip
from machines import Machines, machines_or_skip

PODMAN_TIMEOUT_S = 300  # a wait on a loaded host, never a verdict

# One container run answers every question about the image's contents.
PROBE = """
import json, sys
import torch
try:
    import gpufleet
    has = gpufleet.__file__
except ModuleNotFoundError:
    has = None
print(json.dumps({"torch": torch.__version__, "python": sys.version_info[:2], "gpufleet": has}))
"""


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True,
                          timeout=PODMAN_TIMEOUT_S)
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
    return done


@pytest.fixture(scope="module")
def image() -> str:
    return image_or_skip()


@pytest.fixture(scope="module")
def inside(image: str) -> dict[str, object]:
    """What the image holds, from one `podman run` with the test settings."""
    done = _podman("run", "--rm", "--network", "none", image, "python3", "-c", PROBE)
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_image_imports_the_venvs_torch_under_podman(inside: dict[str, object]) -> None:
    assert inside["torch"] == md.version("torch")
    assert inside["python"] == [3, 11]


def test_the_image_has_no_gpufleet(inside: dict[str, object]) -> None:
    assert inside["gpufleet"] is None


def test_build_again_finds_the_image_and_prints_the_same_name(image: str) -> None:
    for _ in range(2):
        done = subprocess.run([str(SCRIPT), "build"], capture_output=True, text=True,
                              timeout=PODMAN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{image}\n"  # only the name on stdout
        assert f"test-image: found {image}" in done.stderr.splitlines()
        assert "building" not in done.stderr


def test_a_machines_podman_has_the_test_settings_and_its_own_store(image: str) -> None:
    m: Machines = machines_or_skip()
    ours = f"localhost/gpufleet-test:only-here-{uuid.uuid4().hex[:8]}"
    theirs = f"localhost/gpufleet-test:only-m1-{uuid.uuid4().hex[:8]}"
    _podman("tag", image, ours)
    try:
        # over ssh, as a job reaches it: no CONTAINERS_CONF, the machine's /etc/containers
        done = m.ssh("m1", "echo conf=${CONTAINERS_CONF-unset}; "
                     "podman info --format '{{.Host.OCIRuntime.Name}}'; "
                     f"podman tag {image} {theirs} && "
                     "podman images --format '{{.Repository}}:{{.Tag}}'",
                     timeout=PODMAN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.split()
        assert lines[:2] == ["conf=unset", "runc"]
        assert sorted(lines[2:]) == sorted([image, theirs])  # loaded; not this host's tag
        for other in ("m2", "m3"):  # another machine has the image but not m1's tag
            seen = m.run(other, ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                         timeout=PODMAN_TIMEOUT_S).stdout.split()
            assert seen == [image], other
        assert _podman("image", "exists", theirs, check=False).returncode == 1
        # the store is the machine's, not a view of this host's: the host's tag removed, the
        # machine's image runs on (with the runtime and ulimits of its own settings)
        _podman("rmi", ours)
        done = m.ssh("m1", f"podman run --rm --network host {image} "
                     "python3 -c 'import resource, torch; "
                     "print(resource.getrlimit(resource.RLIMIT_NOFILE)[1])'",
                     timeout=PODMAN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["16384"]
    finally:
        _podman("rmi", ours, check=False)
        m.run("m1", ["podman", "rmi", theirs], check=False, timeout=PODMAN_TIMEOUT_S)
        m.settle()  # nothing of this test runs on a machine the next module shares


def test_a_slurm_step_gets_the_settings_through_sruns_environment(image: str) -> None:
    """The test Slurm's nodes run on this host: srun carries CONTAINERS_CONF into the step."""
    slurm = os.environ.get("GPUFLEET_TEST_SLURM")
    if not slurm:
        why = "no test Slurm: $GPUFLEET_TEST_SLURM is not set (scripts/test-slurm up DIR)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the test Slurm: {why}")
        pytest.skip(why)
    done = subprocess.run(
        ["srun", "-N1", "-n1", "bash", "-c",
         "echo $CONTAINERS_CONF; podman info --format '{{.Host.OCIRuntime.Name}}'"],
        capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S,
        env={**os.environ, "SLURM_CONF": f"{slurm}/slurm.conf"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [os.environ["CONTAINERS_CONF"], "runc"]


def test_the_settings_reach_podman_through_the_environment() -> None:
    """The local pool's case: the supervisor and its keeper inherit CONTAINERS_CONF."""
    image_or_skip()
    conf = subprocess.run([str(SCRIPT), "conf"], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()
    assert os.environ["CONTAINERS_CONF"] == conf
    done = _podman("info", "--format", "{{.Host.OCIRuntime.Name}}")
    assert done.stdout.strip() == "runc"
