"""Jobs in a container image on machines that share nothing with the submitter (an SSH pool of
the test machines, each with its own podman store holding the test image) and on the test Slurm.

What a user would check: the pool's default image applies to its jobs, the example GPT trains
across two machines with each node's launcher and workers in the image (the image's own
interpreter; gpufleet's worker side mounted from the node's install, not the submitter's), a
failed rank restarts inside each machine's running container, a killed supervisor leaves no
container on any machine, a missing image is one line naming the
image and the machine; on Slurm, the same GPT in the image through each node's podman inside
the step, with the clean-up step saying what it removed; and on the Ray pool, through
gpufleet's node agent on each Ray node starting the container (not Ray's `image_uri`).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from fleet_helpers import EXAMPLES, WORKERS, Fleet, error_lines
from images import image_or_skip
from machines import Machines, machines_or_skip
from test_ray_pool import ray_pool, rfleet  # noqa: F401  (the test Ray cluster's fixtures)
from test_slurm_pool import _wait_idle as wait_idle
from test_slurm_pool import slurm  # noqa: F401  (the test Slurm's fixture)
from test_ssh_runs import Lab  # the CLI with a HOME of its own for ssh's host keys

RUN_TIMEOUT = 420  # a wait on a loaded host, never a verdict
GONE_WITHIN_S = 90.0  # ssh link gone -> node agent's keeper: SIGTERM, grace, SIGKILL, podman rm


@dataclass
class Pool:
    hosts: Machines
    lab: Lab
    image: str

    def containers(self, job: str) -> dict[str, list[str]]:
        """Each machine's containers of `job` (running or not), by gpufleet's label."""
        return {n: self.hosts.run(n, "podman ps -a --format '{{.Names}}' --filter "
                                     f"label=gpufleet.job={job}", timeout=120).stdout.split()
                for n in self.hosts.names}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    hosts = machines_or_skip()
    image = image_or_skip()
    tmp = tmp_path_factory.mktemp("imagemachines")
    (tmp / "user").mkdir()
    project = tmp / "project"
    project.mkdir()
    for f in ("gpt.py", "gpt-config.json"):
        shutil.copy(EXAMPLES / f, project / f)
    shutil.copy(WORKERS / "napper.py", project / "napper.py")
    lab = Lab(tmp / "home", project, slots=2)
    lab.ok("pool", "add", "ssh", "--name", "lab", "--hostfile", str(hosts.hostfile),
           "--image", image)
    yield Pool(hosts, lab, image)
    left = lab.cleanup()
    assert not left, f"processes left behind on the submitter: {left}"
    hosts.settle(120.0)


def test_the_pools_image_runs_the_gpt_across_two_machines(pool: Pool) -> None:
    listed = pool.lab.json("pool", "list", "lab", "--json")
    assert listed[0]["image"] == pool.image
    done = pool.lab("run", "--gpu", "cpu", "--count", "2", "--nodes", "2", "--name", "gpt",
                    "-y", "gpt.py", "--", "--steps", "10", timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = pool.lab.status("gpt")
    assert (s["status"], s["step"], s["image"]) == ("succeeded", 10, pool.image)
    assert s["loss"] < s["first_loss"] and s["cost_usd"] > 0
    log = pool.lab.ok("logs", "gpt").stdout
    started = [ln for ln in log.splitlines() if f"launcher in image {pool.image}" in ln]
    assert len(started) == 2, log[-3000:]  # one per machine, each with the image's python
    assert all("(podman, /usr/bin/python3, container gpufleet-gpt-" in ln for ln in started)
    assert "2 ranks joined over gloo" in log
    assert pool.containers("gpt") == {n: [] for n in pool.hosts.names}


@pytest.mark.parametrize("slow", [False, True], ids=["quick-to-end", "slow-to-end"])
def test_a_killed_supervisor_leaves_no_container_on_any_machine(pool: Pool, slow: bool) -> None:
    """`slow`: the workers outlast the node agent's grace (a checkpoint saved on SIGTERM), so
    the agent kills them; the keeper, which it must not kill, still removes the container."""
    job = "napslow" if slow else "nap"
    pool.lab.ok("run", "--gpu", "cpu", "--count", "2", "--nodes", "2", "--name", job, "-y",
                "-d", "napper.py", *(["--", "--slow-term", "600"] if slow else []))
    pool.lab.wait_for_step(job, 3, timeout=RUN_TIMEOUT)
    running = {n: c for n, c in pool.containers(job).items() if c}
    assert len(running) == 2 and all(len(c) == 1 for c in running.values()), running
    supervisor = next(p for p in psutil.process_iter(["cmdline", "environ"])
                      if "gpufleet.supervise.supervisor" in " ".join(p.info["cmdline"] or [])
                      and (p.info["environ"] or {}).get("GPUFLEET_HOME") == str(pool.lab.home))
    supervisor.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + GONE_WITHIN_S
    while any(pool.containers(job).values()):
        assert time.monotonic() < deadline, f"containers left: {pool.containers(job)}"
        time.sleep(1.0)
    assert pool.lab.status(job)["status"] == "interrupted"


def test_a_failed_rank_restarts_inside_each_machines_running_container(pool: Pool) -> None:
    """A warm job in the image whose last rank fails in its first run: each machine's launcher
    waits in its container and forks the next run's ranks there (backends/node_restart.py; the
    node's decision file is in the job folder the container mounts): one container per
    machine for both runs, none left after."""
    shutil.copy(WORKERS / "warm_probe.py", pool.lab.cwd / "warm_probe.py")
    durable = Path(tempfile.mkdtemp(prefix="gfim-", dir="/run"))  # every machine sees /run
    try:
        done = pool.lab("run", "--gpu", "cpu", "--count", "2", "--nodes", "2", "--name", "again",
                        "-y", "--max-restarts", "1", "--checkpoint-to", str(durable),
                        "warm_probe.py", "--", "--fail-first-run", "4", timeout=RUN_TIMEOUT)
    finally:
        shutil.rmtree(durable, ignore_errors=True)
    log = pool.lab.ok("logs", "again").stdout
    assert done.returncode == 0, log[-3000:]
    found = re.findall(r"probe rank (\d) warm=True name=__main__ .* forkserver_parent=True "
                       r"frozen=\d+ run=(\d)", log)
    assert sorted(found) == [("0", "1"), ("0", "2"), ("1", "1"), ("1", "2")], log[-3000:]
    assert log.count("run 2: the workers restart inside the running launcher") == 2, log[-3000:]
    started = [ln for ln in log.splitlines() if f"launcher in image {pool.image}" in ln]
    assert len(started) == 2, log[-3000:]  # one container per machine, for both runs
    assert pool.containers("again") == {n: [] for n in pool.hosts.names}


def test_a_missing_image_is_one_line_naming_the_image_and_the_machine(pool: Pool) -> None:
    """Asked of the hosts the pool would grant, before the grant: exit 2, nothing reserved."""
    made = len(pool.lab.clusters(all_=True))
    done = pool.lab("run", "--gpu", "cpu", "--count", "2", "--nodes", "2", "--name", "noimg",
                    "-y", "--image", "localhost/none-such:0", "--pull", "never", "napper.py",
                    timeout=RUN_TIMEOUT)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    [line] = error_lines(done.stderr)
    named = [a for a in pool.hosts.addresses.values()
             if f"image localhost/none-such:0 is not on {a} and could not be pulled" in line]
    assert len(named) == 2, line  # both machines the job would have had, in one line
    assert "Traceback" not in done.stderr
    assert len(pool.lab.clusters(all_=True)) == made  # no cluster made, none left stopped
    assert pool.lab("status", "noimg").returncode != 0  # no job record either


@pytest.mark.usefixtures("slurm")
def test_the_gpt_runs_in_the_image_on_the_test_slurm(tmp_path: Path) -> None:
    image = image_or_skip()
    home = Fleet(tmp_path / "home", tmp_path / "cwd", slots=2)
    home.cwd.mkdir(parents=True, exist_ok=True)
    for f in ("gpt.py", "gpt-config.json"):
        shutil.copy(EXAMPLES / f, home.cwd / f)
    wait_idle(90)
    home.ok("pool", "add", "slurm")
    try:
        done = home("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "--name", "sgpt",
                    "-y", "--image", image, "gpt.py", "--", "--steps", "10",
                    timeout=RUN_TIMEOUT)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        s = home.status("sgpt")
        assert (s["status"], s["step"], s["image"]) == ("succeeded", 10, image)
        log = home.ok("logs", "sgpt").stdout
        assert log.count(f"launcher in image {image} (podman") == 2, log[-3000:]
        assert "containers clean-up in " in log and "container(s) removed" in log, log[-3000:]
        left = subprocess.run(["podman", "ps", "-a", "-q", "--filter",
                               "label=gpufleet.job=sgpt"], capture_output=True, text=True,
                              timeout=120, check=True).stdout.split()
        assert left == []
    finally:
        assert not home.cleanup()


def test_the_gpt_runs_in_the_image_on_the_ray_pool(rfleet: Fleet) -> None:  # noqa: F811
    """Each Ray node's agent (a Ray actor on the host) runs the node's launcher in a container
    of its own, with the node's simulated devices; the agent's keeper removes it at the end."""
    image = image_or_skip()
    for f in ("gpt.py", "gpt-config.json"):
        shutil.copy(EXAMPLES / f, rfleet.cwd / f)
    done = rfleet("run", "--gpu", "H100", "--count", "2", "--nodes", "2", "--name", "rgpt",
                  "-y", "--image", image, "gpt.py", "--", "--steps", "10", timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = rfleet.status("rgpt")
    assert (s["status"], s["step"], s["image"], s["world_size"]) == ("succeeded", 10, image, 2)
    assert s["loss"] < s["first_loss"]
    log = rfleet.ok("logs", "rgpt").stdout
    started = [ln for ln in log.splitlines() if f"launcher in image {image}" in ln]
    assert len(started) == 2, log[-3000:]  # one per Ray node, each with the image's python
    assert all("(podman, /usr/bin/python3, container gpufleet-rgpt-" in ln for ln in started)
    assert "2 ranks joined over gloo" in log
    left = subprocess.run(["podman", "ps", "-a", "-q", "--filter", "label=gpufleet.job=rgpt"],
                          capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert left == []
