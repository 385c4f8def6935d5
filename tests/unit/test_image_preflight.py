"""The node's preflight of an image through its seam: a plain function plays the runtime.

What each argv asks and what the runtime answers are written out, so the pull policy, the
runtime's order and override, and the probe's outcome reaching `ImageError` or `NodeSide` are
checked without podman (the integration tests run the real one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest

from gpufleet.backends.image_preflight import Node, preflight
from gpufleet.backends.image_probe import MARKER
from gpufleet.backends.runtime import Ran, Run, ensure_image, memlock_limit, runtime_facts
from gpufleet.errors import ImageError
from gpufleet.launch.container import Container, NodeSide

ANSWER = (MARKER + '{"python": "/opt/py/bin/python3", "python_version": "3.11.9", "torch": '
          '"2.4.0+cpu", "torch_cuda": null, "shm_bytes": 4294967296, "gpufleet": false}\n')


def which_of(*present: str) -> Callable[[str], str | None]:
    """PATH with `present` in /usr/bin."""
    return lambda name: f"/usr/bin/{name}" if name in present else None


def runtime(images: set[str], pullable: set[str], probe: Ran | None = None,
            asked: list[list[str]] | None = None) -> Run:
    """A podman/docker that has `images`, can pull `pullable`, and answers the probe."""
    def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        args = list(argv)
        if asked is not None:
            asked.append(args)
        flavor = "docker" if args[0].endswith("docker") else "podman"
        match args[1:]:
            case ["--version"]:
                return Ran(0, "Docker version 24.0.7, build x\n" if flavor == "docker"
                           else "podman version 4.3.1\n", "")
            case ["image", "exists", image]:
                return Ran(0 if image in images else 1, "", "")
            case ["image", "inspect", "--format", _, image]:
                return (Ran(0, "sha256:1\n", "") if image in images
                        else Ran(1, "[]\n", f"Error: No such image: {image}\n"))
            case ["pull", _, image]:
                if image in pullable:
                    images.add(image)
                    return Ran(0, "sha256:1\n", "")
                return Ran(125, "", f"Trying to pull {image}...\nError: initializing source "
                           f"docker://{image}: connection refused\n")
            case ["run", *_]:
                return probe or Ran(0, ANSWER, "")
        raise AssertionError(f"unexpected argv {args}")
    return run


def node(run: Run, memlock: int = -1) -> Node:
    return Node(run=run, environ={}, which=which_of("podman"), cuda=lambda: None,
                memlock=lambda: memlock)


IMG = Container(image="localhost/img:1", pull="missing", job="j1")


def test_podman_comes_before_docker_and_the_override_wins() -> None:
    run = runtime(set(), set())
    both = which_of("podman", "docker")
    assert runtime_facts(run, {}, both).path == "/usr/bin/podman"
    picked = runtime_facts(run, {"GPUFLEET_CONTAINER_RUNTIME": "docker"}, both)
    assert (picked.path, picked.flavor, picked.version) == ("/usr/bin/docker", "docker", "24.0.7")
    none = runtime_facts(run, {}, which_of())
    assert none.error == "no container runtime: neither podman nor docker is on PATH"
    wrong = runtime_facts(run, {"GPUFLEET_CONTAINER_RUNTIME": "/opt/nothing"}, which_of())
    assert wrong.error is not None and wrong.error.startswith(
        "GPUFLEET_CONTAINER_RUNTIME=/opt/nothing is not an executable")


def test_a_runtime_whose_version_fails_is_an_error() -> None:
    def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        return Ran(1, "", "Error: cannot re-exec process\n")
    found = runtime_facts(run, {}, which_of("podman"))
    assert found.error == "/usr/bin/podman --version failed: cannot re-exec process"


@pytest.mark.parametrize("flavor", ["podman", "docker"])
def test_pull_policy_asks_the_runtime_what_it_should(flavor: str) -> None:
    rt = f"/usr/bin/{flavor}"
    asked: list[list[str]] = []
    run = runtime({"here:1"}, {"far:1"}, asked=asked)
    assert ensure_image(run, rt, flavor, "here:1", "missing").present  # type: ignore[arg-type]
    assert not any(a[1] == "pull" for a in asked)
    always = ensure_image(run, rt, flavor, "far:1", "always")  # type: ignore[arg-type]
    assert always.present and always.pulled
    never = ensure_image(run, rt, flavor, "gone:1", "never")  # type: ignore[arg-type]
    assert never.error == "--pull never, and it is not there"
    failed = ensure_image(run, rt, flavor, "gone:1", "missing")  # type: ignore[arg-type]
    assert failed.error == "initializing source docker://gone:1: connection refused"


def test_preflight_returns_the_node_side_with_the_images_own_python() -> None:
    said: list[str] = []
    side = preflight(IMG, "n1", said.append, node(runtime({"localhost/img:1"}, set()),
                                                   memlock=8 << 20))
    assert side == NodeSide(runtime="/usr/bin/podman", flavor="podman",
                            python="/opt/py/bin/python3", memlock=8 << 20)
    assert said == ["image localhost/img:1 on n1: n1 cannot raise the locked-memory limit: "
                    "containers get memlock=8 MiB (enough for gloo and NCCL over sockets)"]


def test_preflight_says_a_pull() -> None:
    said: list[str] = []
    preflight(IMG, "n1", said.append, node(runtime(set(), {"localhost/img:1"})))
    assert said == ["image localhost/img:1 pulled on n1"]


def test_preflight_of_a_missing_image_raises_one_line_exit_2() -> None:
    with pytest.raises(ImageError) as err:
        preflight(replace_pull(IMG, "never"), "n1", print, node(runtime(set(), set())))
    assert str(err.value) == ("image localhost/img:1 is not on n1 and could not be pulled: "
                              "--pull never, and it is not there (fix: `podman load -i FILE` "
                              "on n1, or make a registry that has it reachable from the node)")
    assert err.value.exit_code == 2


def test_preflight_joins_every_failure_of_the_image() -> None:
    old = Ran(0, ANSWER.replace("3.11.9", "3.10.4").replace('"2.4.0+cpu"', "null")
              .replace('"shm_bytes": 4294967296', '"shm_bytes": 67108864'), "")
    with pytest.raises(ImageError) as err:
        preflight(IMG, "n1", print, node(runtime({"localhost/img:1"}, set(), probe=old)))
    text = str(err.value)
    parts = ["image localhost/img:1 on n1: Python 3.10.4", "; image localhost/img:1 on n1: torch "
             "is not installed", "; image localhost/img:1 on n1: /dev/shm inside is 64 MiB"]
    assert [text.find(p) for p in parts] == sorted(text.find(p) for p in parts)
    assert -1 not in [text.find(p) for p in parts], text


def test_the_probe_is_the_jobs_own_container() -> None:
    """The probe's argv is `launch.container.wrap`'s, with the snippet for the launcher: the
    job's options, gpufleet's package mounted read-only, and no pull of its own."""
    import gpufleet

    asked: list[list[str]] = []
    c = Container(image="localhost/img:1", pull="always", shm_size="8g", job="j1",
                  opts=("--cap-add=SYS_PTRACE",))
    preflight(c, "n1", print, node(runtime({"localhost/img:1"}, {"localhost/img:1"},
                                           asked=asked), memlock=-1))
    [argv] = [a for a in asked if a[1] == "run"]
    image_at = argv.index("localhost/img:1")
    opts = argv[:image_at]
    package = gpufleet.__path__[0]
    for o in (["--network", "host"], ["--pid", "host"], ["--uts", "host"], ["--shm-size", "8g"],
              ["--ulimit", "memlock=-1:-1"], ["--pull", "never"], ["--label", "gpufleet.job=j1"],
              ["-v", f"{package}:{package}:ro"]):
        assert any(opts[i:i + 2] == o for i in range(len(opts))), o
    assert "--ipc" not in opts and "--cap-add=SYS_PTRACE" in opts
    assert argv[image_at + 1:image_at + 3] == ["python3", "-c"]
    assert argv[argv.index("--name") + 1].startswith("gpufleet-j1-n1-probe-")
    assert sum(a[1] == "pull" for a in asked) == 1  # pulled once (always), not again by the probe


def test_a_gpufleet_that_does_not_import_in_the_image_fails() -> None:
    broken = Ran(0, ANSWER.replace('"gpufleet": false', '"gpufleet": false, "gpufleet_mounted": '
                                   '"SyntaxError: invalid syntax"'), "")
    with pytest.raises(ImageError) as err:
        preflight(IMG, "n1", print, node(runtime({"localhost/img:1"}, set(), probe=broken)))
    assert str(err.value) == ("image localhost/img:1 on n1: gpufleet, mounted from n1, does not "
                              "import in the image's Python (SyntaxError: invalid syntax) "
                              "(choose an image with Python >= 3.11, such as "
                              "nvcr.io/nvidia/pytorch:24.06-py3)")


def test_memlock_is_unlimited_when_a_child_may_raise_it() -> None:
    import resource
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard == resource.RLIM_INFINITY:
        assert memlock_limit(lambda a, t, env=None: Ran(1, "", "")) == -1
        return
    assert memlock_limit(lambda a, t, env=None: Ran(0, "", "")) == -1
    assert memlock_limit(lambda a, t, env=None: Ran(1, "", "ValueError: not allowed")) == hard


def replace_pull(c: Container, pull: str) -> Container:
    from dataclasses import replace
    return replace(c, pull=pull)  # type: ignore[arg-type]



def test_a_docker_without_its_daemon_is_a_runtime_failure_not_a_missing_image() -> None:
    def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        if argv[1:] == ["--version"]:
            return Ran(0, "Docker version 28.2.2, build e6534b4\n", "")
        return Ran(1, "\n", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                   "Is the docker daemon running?\n")
    n = Node(run=run, environ={}, which=which_of("docker"), cuda=lambda: None, memlock=lambda: -1)
    with pytest.raises(ImageError) as err:
        preflight(IMG, "n1", print, n)
    assert str(err.value) == (
        "image localhost/img:1 on n1: docker 28.2.2 (/usr/bin/docker) does not answer: Cannot "
        "connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon "
        "running? (fix: start the runtime's service (docker: its daemon), or choose another "
        "with GPUFLEET_CONTAINER_RUNTIME=podman|docker|PATH)")


def test_podmans_configured_ulimits_are_passed_again_except_the_two_gpufleet_sets() -> None:
    from gpufleet.backends.runtime import configured_ulimits

    files = {"/etc/containers/containers.conf":
             '[containers]\ndefault_ulimits = ["nofile=1024:2048", "memlock=1:1"]\n',
             "/t.conf": '[containers]\ndefault_ulimits = ["nproc=10:10", "stack=1:1"]\n',
             "/h/.config/containers/containers.conf": "[engine]\nruntime = 'runc'\n"}
    assert configured_ulimits("podman", {"HOME": "/h"}, files.get) == ("nofile=1024:2048",)
    # CONTAINERS_CONF is then the only file podman reads
    assert configured_ulimits("podman", {"CONTAINERS_CONF": "/t.conf"}, files.get) == ("nproc=10:10",)
    assert configured_ulimits("docker", {"CONTAINERS_CONF": "/t.conf"}, files.get) == ()
    assert configured_ulimits("podman", {"HOME": "/h"}, {"/etc/containers/containers.conf":
                                                         "not toml ["}.get) == ()
