"""The throw-away Slurm cluster of `scripts/test-slurm` itself, which the Slurm backend's tests
stand on: `up` gives three idle nodes with one simulated `gpu:h100` each, a two-node step runs on
two of them and sees its node's name and GPU, `kill-node` makes a node really die (its slurmd
and its job steps; slurmctld marks it down) and `start-node` brings it back, and `down` leaves
no process of the cluster behind.

The module's cluster runs in a fresh folder under /tmp (short: unix sockets live in it). Slurm's
daemons run as root here, so without root or without Slurm's binaries (Debian's slurmctld,
slurmd, slurm-client and munge) the tests are skipped, a failure under CI=true.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-slurm"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "scripts/test-slurm runs munged and slurmd as root, and this is not root"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"no {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)"
    return None


def _require_slurm() -> None:
    reason = _unavailable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def _environ(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # gone, a kernel thread, or not ours to read
        return []


def _live(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return re.search(r"^State:\s*Z", status, re.MULTILINE) is None


def _processes(match: Callable[[list[str]], bool]) -> list[int]:
    """Live processes (not this one) whose environment `match` accepts."""
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [p for p in pids if p != os.getpid() and match(_environ(p)) and _live(p)]


def _eventually(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until `check` held; fails after `timeout`."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.2)
    return time.monotonic() - start


@dataclass
class Cluster:
    folder: str
    env: dict[str, str]

    def run(self, *args: str) -> str:
        done = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def harness(self, *args: str) -> None:
        self.run(str(SCRIPT), args[0], self.folder, *args[1:])

    def nodes(self) -> dict[str, dict[str, str]]:
        """`scontrol -o show node`, a dict of each node's fields."""
        nodes = {}
        for line in self.run("scontrol", "-o", "show", "node").splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            nodes[fields["NodeName"]] = fields
        return nodes

    def hostnames(self, nodelist: str) -> list[str]:
        return self.run("scontrol", "show", "hostnames", nodelist).split() if nodelist else []

    def state(self, node: str) -> str:
        return self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T").strip()

    def ours(self) -> list[int]:
        """Live processes of this cluster: its daemons (and their slurmstepds), its jobs' tasks."""
        mark, conf = f"GPUFLEET_TEST_SLURM_DAEMON={self.folder}:", f"SLURM_CONF={self.folder}/slurm.conf"
        return _processes(lambda env: any(v.startswith(mark) for v in env)
                          or (conf in env and any(v.startswith("SLURM_JOB_ID=") for v in env)))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    _require_slurm()
    folder = tempfile.mkdtemp(dir="/tmp", prefix="gfs")
    c = Cluster(folder, dict(os.environ))
    try:
        up = subprocess.run([str(SCRIPT), "up", folder], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, f"scripts/test-slurm up failed:\n{up.stderr}"
        exports = up.stdout.strip().splitlines()
        assert len(exports) == 1 and exports[0].startswith("export "), up.stdout
        c.env.update(v.partition("=")[::2] for v in exports[0].split()[1:])
        assert c.env["SLURM_CONF"] == f"{folder}/slurm.conf" and c.env["GPUFLEET_TEST_SLURM"] == folder
        yield c
    finally:
        down = subprocess.run([str(SCRIPT), "down", folder], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not Path(folder).exists()
    left = c.ours()
    assert not left, f"processes of the cluster left by down: {left}"


def test_every_node_is_idle_with_one_simulated_gpu(cluster: Cluster) -> None:
    nodes = cluster.nodes()
    assert sorted(nodes) == ["n1", "n2", "n3"]
    for name, node in nodes.items():
        assert node["State"] == "IDLE", (name, node["State"])
        assert node["Gres"] == "gpu:h100:1"
        assert node["NodeAddr"] == "127.0.0.1"
        assert node["CPUTot"] == "4" and node["RealMemory"] == "2000"
        assert node["AvailableFeatures"] == "gpufleet-simulated"
        assert stat.S_ISCHR(os.stat(f"{cluster.folder}/dev/{name}-gpu0").st_mode)
    ports = {node["Port"] for node in nodes.values()}
    assert len(ports) == 3


def test_a_two_node_step_sees_its_node_and_gpu(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    cluster.run("sbatch", "--parsable", "-N2", "--gres=gpu:1", f"--output={out}", "--wrap",
                'srun -l bash -c \'echo "$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"\'; echo done')
    _eventually("the batch job's output", lambda: out.exists() and "done" in out.read_text(), 20)
    lines = sorted(line.split(": ", 1)[1] for line in out.read_text().splitlines() if ": " in line)
    assert len(lines) == 2, out.read_text()
    names = {line.split()[0] for line in lines}
    assert len(names) == 2 and names <= {"n1", "n2", "n3"}, lines
    assert all(line.endswith(" gpus=0") for line in lines), lines
    # and a step of its own, srun without sbatch
    step = cluster.run("srun", "-N2", "-n2", "--gres=gpu:1", "bash", "-c",
                       'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"')
    assert sorted(step.split()[1::2]) == ["0", "0"] and len(set(step.split()[::2])) == 2, step


def test_a_killed_node_dies_with_its_steps_and_comes_back(cluster: Cluster) -> None:
    job = cluster.run("sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap", "srun sleep 300")
    job = job.strip()

    def tasks(node: str | None = None) -> list[int]:
        """The job's `sleep` tasks (on that node)."""
        def match(env: list[str]) -> bool:
            return (f"SLURM_JOB_ID={job}" in env and f"SLURM_CONF={cluster.folder}/slurm.conf" in env
                    and "SLURM_STEP_ID=0" in env and (node is None or f"SLURMD_NODENAME={node}" in env))
        return _processes(match)

    _eventually("both tasks of the job's step run", lambda: len(tasks()) == 2, 20)
    # not the batch host: the job's srun runs there, and with it gone the other task would end
    # too, sooner or later
    node = cluster.hostnames(cluster.run("squeue", "-h", "-j", job, "-o", "%N").strip())[-1]
    cluster.harness("kill-node", node)
    assert not tasks(node), "the killed node's task still runs"
    assert tasks(), "the other node's task was killed too"
    took = _eventually(f"{node} shown down", lambda: cluster.state(node).startswith("down"), 25)
    print(f"{node} down {took:.1f}s after its kill")
    # slurmctld took the job off the dead node: requeued (pending), or ending where it still ran
    state, _, nodelist = cluster.run("squeue", "-h", "-j", job, "-o", "%T %N").strip().partition(" ")
    assert state != "RUNNING" or node not in cluster.hostnames(nodelist), (state, nodelist)
    cluster.harness("start-node", node)
    assert cluster.state(node) in ("idle", "mixed", "allocated")
    cluster.run("scancel", job)
    _eventually("every node idle again",
                lambda: all(n["State"] == "IDLE" for n in cluster.nodes().values()), 20)
    _eventually("the job's tasks ended", lambda: not tasks(), 10)


def test_up_refuses_a_folder_whose_path_is_too_long() -> None:
    _require_slurm()
    folder = "/tmp/" + "d" * 56  # 61 characters
    done = subprocess.run([str(SCRIPT), "up", folder], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "60" in done.stderr, done.stderr
    assert not Path(folder).exists()
