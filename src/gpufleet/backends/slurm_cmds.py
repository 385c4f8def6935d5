"""The Slurm command lines gpufleet runs, built from plain data (pure: `--dry-run` prints them
and the tests read them without a Slurm).

One allocation per cluster: an `sbatch` whose batch step only holds the nodes (`sleep
infinity`) until `scancel`, so the allocation lives exactly as long as the cluster, whatever
runs on it. Each run of a job then starts one step per node inside it (`srun --jobid J -w NODE
--overlap`), which runs that node's torchrun.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

from gpufleet.backends.slurm_parse import hostnames

JOB_PREFIX = "gpufleet-"  # every Slurm job gpufleet submits is named gpufleet-CLUSTER
HOLD = "exec sleep infinity"


@dataclass(frozen=True)
class Ask:
    """What one cluster asks Slurm for."""

    cluster: str
    nodes: int
    per_node: int  # GPUs on each node
    gres_type: str = ""  # --gres=gpu:TYPE:N ("" untyped)
    feature: str = ""  # --constraint: the GPU type's feature (untyped GRES), the network's
    partition: str | None = None
    account: str | None = None
    time_limit_s: float | None = None
    exclude: tuple[str, ...] = ()  # nodes not to take (a heal's lost ones)
    whole_nodes: bool = False  # --exclusive: a multi-node cluster takes its nodes whole
    no_kill: bool = False  # --no-kill: a node's failure does not end the allocation (spares)
    cpus_per_gpu: int = 0  # 0: Slurm's default
    mem_per_gpu_mb: int = 0
    user: str = ""

    @property
    def gres(self) -> str:
        return f"gpu:{self.gres_type}:{self.per_node}" if self.gres_type else f"gpu:{self.per_node}"

    @property
    def comment(self) -> str:
        """Slurm keeps the comment with the job: who and what, for a site's own tools."""
        who = f" for {self.user}" if self.user else ""
        return f"gpufleet cluster {self.cluster}{who}"


def job_name(cluster: str) -> str:
    return f"{JOB_PREFIX}{cluster}"


def time_arg(seconds: float) -> str:
    """Slurm's --time in whole minutes, rounded up (Slurm would stop the job early otherwise)."""
    return str(max(1, math.ceil(seconds / 60)))


def sbatch(ask: Ask) -> list[str]:
    argv = ["sbatch", "--parsable", f"--job-name={job_name(ask.cluster)}",
            f"--comment={ask.comment}", f"--nodes={ask.nodes}", "--ntasks-per-node=1",
            f"--gres={ask.gres}", "--no-requeue", "--output=/dev/null", "--error=/dev/null"]
    if ask.partition:
        argv.append(f"--partition={ask.partition}")
    if ask.account:
        argv.append(f"--account={ask.account}")
    if ask.feature:
        argv.append(f"--constraint={ask.feature}")
    if ask.time_limit_s:
        argv.append(f"--time={time_arg(ask.time_limit_s)}")
    if ask.exclude:
        argv.append(f"--exclude={','.join(ask.exclude)}")
    if ask.no_kill:
        argv.append("--no-kill")
    if ask.whole_nodes:
        argv += ["--exclusive", "--mem=0"]
    else:
        if ask.cpus_per_gpu:
            argv.append(f"--cpus-per-gpu={ask.cpus_per_gpu}")
        if ask.mem_per_gpu_mb:
            argv.append(f"--mem-per-gpu={ask.mem_per_gpu_mb}M")
    return [*argv, f"--wrap={HOLD}"]


STEP_NAME = "gpufleet-run"  # a run's steps: ended by name, a `gpufleet ssh` step is not


def srun(job_id: str, node: str, argv: list[str], chdir: str | None = None) -> list[str]:
    """One step on one node of the allocation: a single task that shares the allocation with
    the holding step (`--overlap`), gets the whole environment, and whose failure ends it.
    `chdir`: where the step starts, for a node that does not have this machine's folder
    (slurmstepd would say it could not go there, twice, before going to /tmp)."""
    where = [f"--chdir={chdir}"] if chdir else []
    return ["srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            "--overlap", "--kill-on-bad-exit=1", "--export=ALL", "--quiet",
            f"--job-name={STEP_NAME}", *where, *argv]


PROBE_STEP = "gpufleet-probe"
PROBE_MARK = "gpufleet-sees"


def sees_step(job_id: str, nodes: list[str], path: str) -> list[str]:
    """One step over the allocation's `nodes`, a task on each, that prints what the node reads
    at `path` (`gpufleet-sees NODE CONTENT`, CONTENT empty when it reads nothing): the probe of
    backends/shipping.py. A plain shell, so it works before gpufleet is on the node."""
    script = 'printf "%s %s %s\\n" ' + PROBE_MARK + ' "$SLURMD_NODENAME" "$(cat -- "$1" 2>/dev/null)"'
    return ["srun", f"--jobid={job_id}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--quiet",
            f"--job-name={PROBE_STEP}", "/bin/sh", "-c", script, "sh", path]


CLEAN_STEP = "gpufleet-clean"


def clean_step(job_id: str, nodes: list[str], argv: list[str]) -> list[str]:
    """A run's clean-up (slurm_clean) over the allocation's `nodes`."""
    return spread_step(job_id, nodes, CLEAN_STEP, argv)


def spread_step(job_id: str, nodes: list[str], name: str, argv: list[str]) -> list[str]:
    """One step named `name` over the allocation's `nodes`, a task on each, running `argv`
    from `/` (the nodes need not have this machine's folder): a clean-up, the spares' warming
    (slurm_spares)."""
    return ["srun", f"--jobid={job_id}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--overlap", "--quiet",
            f"--job-name={name}", "--chdir=/", *argv]


def sbcast(job_id: str, src: str, dest: str) -> list[str]:
    """A file to node-local `dest` on every node of the allocation (Slurm's own broadcast)."""
    return ["sbcast", f"--jobid={job_id}", "--force", src, dest]


def bcast_missed(stderr: str) -> list[str] | None:
    """The nodes a failed `sbcast` names as not reached (`REQUEST_FILE_BCAST(n2): Communication
    connection failure`), or None when one of its errors names no node (then nothing is known
    to have arrived anywhere). With `--no-kill` a node that just died stays in the allocation until
    slurmctld marks it down, and sbcast, which sends to every node of the allocation, fails on
    it while the others get the file (seen on the test machines: a spare took the lost node's
    place and the new run's sbcast failed on the dead one)."""
    errors = [row for row in stderr.splitlines() if "error:" in row]
    names = [m.group(1) for row in errors
             if (m := re.search(r"REQUEST_FILE_BCAST\(([^)]+)\)", row))]
    if not names or len(names) < len(errors):
        return None
    return sorted({h for name in names for h in hostnames(name)})


def node_local(kind: str, name: str) -> str:
    """Where a shipped file lands on a node: its local /tmp, named for what it holds."""
    return f"/tmp/gpufleet-{kind}-{name}"


def seen_by(output: str, content: str) -> dict[str, bool]:
    """Each node's answer in `sees_step`'s output: whether it read exactly `content`."""
    seen: dict[str, bool] = {}
    for row in output.splitlines():
        parts = row.split(" ", 2)
        if len(parts) >= 2 and parts[0] == PROBE_MARK:
            seen[parts[1]] = (parts[2] if len(parts) == 3 else "") == content
    return seen


def shell(job_id: str, node: str, argv: list[str]) -> list[str]:
    """`gpufleet ssh`: an interactive step on the node (a pseudo-terminal when there is no
    command), inside the cluster's allocation."""
    pty = [] if argv[1:] else ["--pty"]
    return ["srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            "--overlap", "--export=ALL", *pty, *argv]


def scancel(job_id: str) -> list[str]:
    return ["scancel", job_id]


def show_job(job_id: str) -> list[str]:
    return ["scontrol", "-o", "-d", "show", "job", job_id]


def show_nodes() -> list[str]:
    return ["scontrol", "-o", "-d", "show", "node"]


def show_partitions() -> list[str]:
    return ["scontrol", "-o", "show", "partition"]


def mine() -> list[str]:
    """Slurm's queue for gpufleet's jobs: id, name, state, reason, nodes (`|` between)."""
    return ["squeue", "-h", "-o", "%i|%j|%T|%r|%N"]


def line(argv: list[str]) -> str:
    return shlex.join(argv)
