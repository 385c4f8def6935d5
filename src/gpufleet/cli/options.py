"""Every option more than one command takes, declared once as an `Annotated` alias.

A default that is not the parameter's own (None meaning "decided later") is written into the
help with `default()`, whose brackets are escaped: Rich would read a bare `[default: 5m]` as
markup and delete it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.vocab import FRAMEWORKS, NETWORKS, PRECISIONS, PULLS, SCHEDULES, STRATEGIES, spoken


def default(text: str) -> str:
    """` [default: TEXT]` as help text that survives Rich markup."""
    return f" \\[default: {text}]"


GPU_TYPES = "GPU type, e.g. H100, A100, RTX4090, cpu (gpufleet prices lists them)."

# -- output and confirmation ---------------------------------------------------------------------
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]

# -- a cluster -----------------------------------------------------------------------------------
GpuFilter = Annotated[str | None, typer.Option("--gpu", help="Only this GPU type.")]
Gpu = Annotated[str | None, typer.Option("--gpu", help=GPU_TYPES)]
Count = Annotated[int | None, typer.Option(
    "--count", help="Number of GPUs (1-128)." + default("1"))]
Network = Annotated[str | None, typer.Option(
    "--network", help=f"{spoken(NETWORKS)}."
    + default("pcie in one node, ethernet across nodes"))]
PlanNetwork = Annotated[str | None, typer.Option(
    "--network", help=f"{spoken(NETWORKS)}."
    + default("the GPU's node fabric; infiniband above 8 GPUs"))]
Disk = Annotated[str | None, typer.Option(
    "--disk", help="Scratch space, e.g. 100GB, 1TB." + default("1GB"))]
Nodes = Annotated[int | None, typer.Option(
    "--nodes", help="Nodes to spread over." + default("1 on this host, else 8 GPUs a node"))]
Spares = Annotated[int | None, typer.Option(
    "--spares", help="Whole free nodes held beside the cluster's on an SSH, Ray or Slurm pool "
    "(on Slurm: in the same allocation): each run ships its workdir, runs its setup and pulls "
    "its image there, and a lost node is replaced by one at once. Billed with the cluster."
    + default("0"))]
Backend = Annotated[str | None, typer.Option(
    "--backend", help="local, ray or sim: the only pool of that kind.")]
PoolOpt = Annotated[str | None, typer.Option(
    "--pool", help="Pool to carve from." + default("the default pool, see gpufleet pool list"))]
PriceBook = Annotated[str | None, typer.Option(
    "--price-book", help="Bill under this book." + default("cheapest offering the GPU"))]
CpuSlots = Annotated[int | None, typer.Option(
    "--cpu-slots", help="CPU worker slots this host offers." + default("$GPUFLEET_CPU_SLOTS or cores"))]
ClusterYaml = Annotated[Path | None, typer.Option("-f", "--file", help="Cluster YAML.")]
ClusterName = Annotated[str | None, typer.Option("--name", help="Cluster name (DNS-like).")]
OnCluster = Annotated[str | None, typer.Option("--cluster", "-c", help="Existing cluster.")]
IdleCluster = Annotated[str, typer.Option("--cluster", "-c", help="Cluster to measure (idle).")]

# -- a training layout ---------------------------------------------------------------------------
Strategy = Annotated[str | None, typer.Option(
    "--strategy", help=f"{spoken(STRATEGIES)}." + default("ddp"))]
Dp = Annotated[int | None, typer.Option("--dp", help="Data-parallel degree of the mesh.")]
Tp = Annotated[int | None, typer.Option("--tp", help="Tensor-parallel degree.")]
Pp = Annotated[int | None, typer.Option("--pp", help="Pipeline stages.")]
PpSchedule = Annotated[str | None, typer.Option(
    "--pp-schedule", help=f"{spoken(SCHEDULES)}." + default("1f1b"))]
Microbatches = Annotated[int | None, typer.Option(
    "--microbatches", help="Pipeline micro-batches per step." + default("--pp"))]
Framework = Annotated[str | None, typer.Option(
    "--framework", help=f"{spoken(FRAMEWORKS)}." + default("torchrun"))]
RunPrecision = Annotated[str | None, typer.Option(
    "--precision", help=f"{spoken(PRECISIONS)}." + default("fp32"))]
PlanPrecision = Annotated[str | None, typer.Option(
    "--precision", help=f"{spoken(PRECISIONS)}." + default("bf16-mixed"))]

# -- progress of any script (the worker bootstrap, gpufleet/bootstrap) ---------------------------
TotalSteps = Annotated[int | None, typer.Option(
    "--total-steps", help="Optimizer steps the script will take, for the ETA."
    + default("the script's --max_steps/--max_iters, else unknown"))]
LossPattern = Annotated[str | None, typer.Option(
    "--loss-pattern", help="Regex whose first group is the loss in the script's log lines."
    + default("'loss 2.31', 'loss: 2.31', {'loss': 2.31}"))]
WarmOpt = Annotated[bool | None, typer.Option(
    "--warm/--no-warm", help="Fork the workers from a process that has torch imported (torchrun "
    "and deepspeed): no import per worker at each start and restart. --no-warm starts each "
    "worker as a fresh Python process." + default("warm"))]
PreloadOpt = Annotated[str | None, typer.Option(
    "--preload", help="More modules imported once before the warm workers fork, comma "
    "separated, e.g. transformers,datasets.")]
BootstrapOpt = Annotated[bool, typer.Option(
    "--bootstrap/--no-bootstrap", help="Count optimizer steps and record errors in every "
    "worker, for scripts that do not call gpufleet.train.report.")]

# -- what a model is -----------------------------------------------------------------------------
Params = Annotated[float | None, typer.Option("--params", help="A bare parameter count, e.g. 7e9.")]
ModelConfig = Annotated[str | None, typer.Option("--config", help="A Hugging Face config.json.")]
CalibrationOut = Annotated[Path | None, typer.Option(
    "--out", help="Calibration file." + default("$GPUFLEET_HOME/calibrations/calibration-CLUSTER.json"))]

# -- pools ---------------------------------------------------------------------------------------
NoDefault = Annotated[bool, typer.Option("--no-default", help="Keep the current default pool.")]

# -- the queue -----------------------------------------------------------------------------------
Priority = Annotated[int | None, typer.Option(
    "--priority", help="Higher starts first (-100 to 100); same priority: first come, first "
    "served, with fair share between users." + default("0"))]
TimeLimit = Annotated[str | None, typer.Option(
    "--time-limit", help="Stop the job after this long, e.g. 30m, 2h; the queue plans with it "
    "(estimated starts, small jobs started early).")]
NoQueue = Annotated[bool, typer.Option(
    "--no-queue", help="Refuse instead of queueing when the devices are busy.")]
After = Annotated[str | None, typer.Option(
    "--after", metavar="JOB", help="Start only after this job of yours succeeded (Slurm's "
    "afterok); if it fails or is stopped, this job is cancelled with that reason.")]

# -- code and environment that travel to nodes that do not share this machine's files ----------
Setup = Annotated[str | None, typer.Option(
    "--setup", metavar="CMD", help="Shell command run once per node per workdir before the "
    "start, in the workdir (e.g. 'pip install -r requirements.txt'); its output is in the "
    "job's log, its failure the job's reason.")]
MaxUpload = Annotated[str | None, typer.Option(
    "--max-upload", metavar="SIZE", help="Refuse to ship a workdir above this size, e.g. "
    "500MB, 2GB (at least 1MB)." + default("100MB"))]
KeepWorkdir = Annotated[bool, typer.Option(
    "--keep-workdir", help="Keep the shipped workdir on the nodes after the job.")]
# -- a container image (launch/container.py) ------------------------------------------------------
Image = Annotated[str | None, typer.Option(
    "--image", metavar="IMAGE", help="Run each node's launcher and workers in this container "
    "image (podman or docker on the node), e.g. nvcr.io/nvidia/pytorch:24.06-py3." + default(
        "the cluster's or pool's image, else none"))]
PullOpt = Annotated[str | None, typer.Option(
    "--pull", metavar="WHEN", help=f"With --image: when each node pulls it: {spoken(PULLS)}."
    + default("missing"))]
ContainerOpt = Annotated[list[str] | None, typer.Option(
    "--container-opt", metavar="OPT", help="With --image: one more runtime option, e.g. "
    "'--cap-add=SYS_PTRACE' (repeatable; what gpufleet sets itself is refused).")]
ShmSizeOpt = Annotated[str | None, typer.Option(
    "--shm-size", metavar="SIZE", help="With --image: a private /dev/shm of this size (at "
    "least 1g)." + default("the host's /dev/shm"))]
