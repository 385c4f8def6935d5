"""ClusterSpec and JobSpec: the one place input is validated.

CLI flags, YAML files and the Python API all build these models through `ClusterSpec.parse` /
`JobSpec.parse`, which report every problem of one spec together, each naming its field and the
allowed values, as a `SpecError` (exit code 2 in the CLI). They validate data only: whether the
script is a file is looked at by the edge that takes the job (`script_file.parse_job_here`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, Any, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from gpufleet import catalog
from gpufleet.backends.kinds import Kind, capabilities
from gpufleet.errors import SpecError, excerpt
from gpufleet.launch.workdir import DEFAULT_MAX_UPLOAD, MIN_MAX_UPLOAD, parse_size
from gpufleet.parallelism import Layout, resolve
from gpufleet.spec_image import ContainerOpts, ImageRef, ShmSize
from gpufleet.spec_start import Preload, start_problems
from gpufleet.spec_yaml import load_yaml as load_yaml  # where it lived before; callers import it here
from gpufleet.vocab import INTER_NODE_NETWORKS, Framework, Network, Precision, Pull, Schedule, Strategy

MAX_GPUS_PER_JOB = 128  # seed 000: up to 128 GPUs per job (16 nodes x 8)
MAX_GPUS_PER_NODE = 8
DEFAULT_DISK = "1GB"

_NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DISK_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_UNIT_POWER = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_disk(value: str | int | float) -> int:
    """Bytes for a size such as '1TB' (10^12), '500GiB' (2^30 units), '100B' (bytes) or a bare
    number of GB. Zero is refused: a cluster needs some scratch space."""
    text = str(value)
    m = _DISK_RE.fullmatch(text)
    if not m or (m.group(3) and not m.group(2)):
        raise ValueError(f"'{excerpt(text)}' is not a size; use e.g. 100GB, 1TB, 500GiB")
    number, unit, binary, byte = m.groups()
    base = 1024 if binary else 1000
    power = _UNIT_POWER[unit.lower()] if unit else (0 if byte else 3)
    size = int(float(number) * base**power)
    if size <= 0:
        raise ValueError(f"'{excerpt(text)}' is not a size above zero; use e.g. 100GB, 1TB")
    return size


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_DURATION_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str | int | float) -> float:
    """Seconds for '90s', '5m', '1.5h', '2d', '250ms' or a bare number of seconds."""
    m = _DURATION_RE.fullmatch(str(value))
    if not m:
        raise ValueError(f"'{excerpt(value)}' is not a duration; use e.g. 30s, 5m, 1h, 2d")
    seconds = float(m.group(1)) * _DURATION_UNIT[(m.group(2) or "s").lower()]
    if seconds <= 0:
        raise ValueError(f"'{excerpt(value)}' is not a duration above zero; use e.g. 30s, 5m")
    return seconds


def parse_workers(value: str | int) -> tuple[int, int]:
    """(min, max) from 'MIN:MAX' or a single number N (N:N)."""
    text = str(value).strip()
    lo, sep, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise ValueError(f"'{excerpt(text)}' is not a worker range; use MIN:MAX, e.g. 2:8") from None
    if low < 1 or high < low or high > MAX_GPUS_PER_JOB:
        raise ValueError(f"'{excerpt(text)}' is not a worker range; use MIN:MAX with 1 <= MIN <= MAX <= "
                         f"{MAX_GPUS_PER_JOB}, e.g. 2:8")
    return low, high


def check_name(value: str, what: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"'{excerpt(value)}' is not a valid {what} name: use 1-40 lowercase letters, digits and '-', "
            "starting with a letter and not ending with '-'"
        )
    return value


# Variables gpufleet sets for every worker; a job's `env` may not change them.
_OWNED_ENV = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "RANK", "LOCAL_RANK", "WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"}
_REQUIRED_HINTS = {"gpu": " (e.g. --gpu H100 or --gpu cpu; `gpufleet prices` lists the types)"}
_RANGE_HINTS = {"count": f" (1 to {MAX_GPUS_PER_JOB} GPUs per job)"}


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for e in exc.errors():
        field = ".".join(str(p) for p in e["loc"]) or "spec"
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "is required" + _REQUIRED_HINTS.get(field, "")
        elif e["type"] in ("less_than_equal", "greater_than_equal"):
            lo_hi = "at most" if e["type"] == "less_than_equal" else "at least"
            bound = e["ctx"]["le" if e["type"] == "less_than_equal" else "ge"]
            msg = f"got {excerpt(e['input'])}; must be {lo_hi} {bound}{_RANGE_HINTS.get(field, '')}"
        elif e["type"] == "literal_error":
            msg = f"'{excerpt(e['input'])}' is not allowed; allowed: {e['ctx']['expected']}"
        out.append((field, msg))
    return out


def _scalar_to_str(v: Any) -> Any:
    """YAML reads `OMP_NUM_THREADS: 4` and `args: [--epochs, 3]` as numbers; they mean strings."""
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v) if isinstance(v, int | float) else v


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def positive_duration(v: Any) -> str | None:
    """A time limit: None, or a duration longer than zero."""
    if v is None:
        return None
    if parse_duration(v) <= 0:
        raise ValueError("must be longer than 0s, e.g. 30m or 2h")
    return str(v)


class ClusterSpec(_Spec):
    """A homogeneous cluster: `count` devices of one GPU type over `nodes` nodes."""

    name: str | None = None
    gpu: str
    count: int = Field(1, ge=1, le=MAX_GPUS_PER_JOB)
    network: Network | None = None
    nodes: int | None = Field(None, ge=1, le=MAX_GPUS_PER_JOB)
    # whole free nodes held beside the cluster's own, warmed by each run and billed with it; a
    # lost node is replaced by one of them first (lifecycle/spares.py)
    spares: int = Field(0, ge=0, le=MAX_GPUS_PER_JOB)
    disk: str = DEFAULT_DISK
    backend: Kind = "local"
    pool: str | None = None  # a named pool (gpufleet pool list); None: the default pool
    price_book: str | None = None
    # how long the cluster may hold its nodes: an engine that allocates (Slurm) is asked for
    # exactly this (sbatch --time); None: the partition's own limit
    time_limit: str | None = None
    # the image every job on this cluster runs in unless it names its own (`launch --image`;
    # lifecycle/images.py)
    image: ImageRef | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return None if v is None else check_name(v, "cluster")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> str | None:
        return positive_duration(v)

    @property
    def time_limit_s(self) -> float | None:
        return None if self.time_limit is None else parse_duration(self.time_limit)

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, v: Any) -> str:
        parts = v if isinstance(v, list) else re.split(r"[,+]", str(v))
        try:
            names = {catalog.resolve_gpu(str(p).strip()).name for p in parts if str(p).strip()}
        except SpecError as exc:
            raise ValueError(exc.problems[0][1]) from None
        if len(names) > 1:
            raise ValueError(
                f"mixed GPU types are refused ({', '.join(sorted(names))}): a cluster has one "
                "GPU type, so the fastest GPUs would wait for the slowest; launch one cluster "
                "per type"
            )
        if not names:
            raise ValueError("a GPU type is required")
        return names.pop()

    @field_validator("pool")
    @classmethod
    def _pool(cls, v: str | None) -> str | None:
        return None if v is None else check_name(v, "pool")

    @field_validator("disk", mode="before")
    @classmethod
    def _disk(cls, v: Any) -> str:
        parse_disk(v)
        return str(v)

    @field_validator("price_book")
    @classmethod
    def _book(cls, v: str | None) -> str | None:
        if v is not None and v not in catalog.price_books():
            raise ValueError(f"unknown price book '{excerpt(v)}'; allowed: "
                             f"{', '.join(catalog.price_books())}")
        return v

    @property
    def disk_bytes(self) -> int:
        return parse_disk(self.disk)

    @property
    def node_count(self) -> int:
        """Nodes given; else one on the local backend (it has one node), else the fewest that keep
        every node at 8 GPUs or fewer."""
        if self.nodes:
            return self.nodes
        if not capabilities(self.backend).multi_node:
            return 1
        return math.ceil(self.count / MAX_GPUS_PER_NODE)

    @property
    def per_node(self) -> int:
        return self.count // self.node_count

    @property
    def fabric(self) -> str:
        """The network, defaulting to PCIe in one node and Ethernet across nodes."""
        if self.network:
            return self.network
        return "pcie" if self.node_count == 1 else "ethernet"

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Self:
        """Validate, then apply the rules that span fields; raise one SpecError with all problems."""
        data = {k: v for k, v in data.items() if v is not None}
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            problems = _errors(exc)
            raise SpecError(problems + cls._cross_field_despite(data, problems)) from None
        problems = spec._cross_field_problems()
        if problems:
            raise SpecError(problems)
        return spec

    @classmethod
    def _cross_field_despite(cls, data: dict[str, Any],
                             problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The cross-field rules too, when the fields they read are valid, so one run of the
        command shows every problem. Invalid fields that the rules do not read are replaced by
        harmless placeholders."""
        bad = {field.split(".")[0] for field, _ in problems}
        if bad & {"count", "nodes", "network", "backend", "pool", "spares"}:
            return []
        placeholders = {"gpu": "cpu", "name": None, "disk": DEFAULT_DISK, "price_book": None}
        trial = {k: v for k, v in data.items() if k not in bad}
        trial.update({k: v for k, v in placeholders.items() if k in bad and v is not None})
        try:
            return cls.model_validate(trial)._cross_field_problems()
        except ValidationError:
            return []

    def _cross_field_problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        nodes = self.node_count
        if self.count % nodes:
            problems.append(("nodes", f"{self.count} GPUs cannot be split evenly over {nodes} "
                             "nodes; a cluster has the same number of GPUs on every node"))
        elif self.count // nodes > MAX_GPUS_PER_NODE and (
                self.gpu != "cpu" or capabilities(self.backend).multi_node):
            # CPU slots on this host: as many as it offers (--cpu-slots), checked where known
            where = (f" (the {self.backend} backend has one node)"
                     if not capabilities(self.backend).multi_node else "")
            problems.append(("count", f"at most {MAX_GPUS_PER_NODE} GPUs per node: {self.count} "
                             f"GPUs need --nodes {math.ceil(self.count / MAX_GPUS_PER_NODE)} "
                             f"or more{where}"))
        if nodes > 1 and self.network == "nvswitch":
            problems.append(("network", f"nvswitch connects GPUs within one node; {nodes} nodes "
                             f"need one of: {', '.join(INTER_NODE_NETWORKS)}"))
        elif nodes > 1 and self.network is not None and self.network not in INTER_NODE_NETWORKS:
            problems.append(("network", f"{self.network} does not span nodes; {nodes} nodes need "
                             f"one of: {', '.join(INTER_NODE_NETWORKS)}"))
        if nodes > 1 and not capabilities(self.backend).multi_node:
            problems.append(("nodes", f"the {self.backend} backend has one node; {nodes} nodes need a "
                             "multi-node pool: gpufleet pool add ray --address HOST:PORT, or "
                             "gpufleet pool up --local --nodes 3 to try one here"))
        caps = capabilities(self.backend)
        if self.spares and (not caps.multi_node or caps.simulated):
            problems.append(("spares", f"spare nodes are held on multi-node pools that run "
                             f"processes (ssh, ray, slurm); the {self.backend} pool "
                             + ("has one node" if not caps.multi_node else "runs no processes")
                             + "; drop --spares"))
        return problems

    @property
    def billed_count(self) -> int:
        """Devices billed: the cluster's own and every spare node's."""
        return self.count + self.spares * self.per_node


class ModelShape(_Spec):
    """The model's layer and attention-head counts, so a mesh that cannot fit the model is refused
    before any process starts."""

    layers: int | None = Field(None, ge=1)
    heads: int | None = Field(None, ge=1)


class JobSpec(_Spec):
    """A training script and how to run it on a cluster."""

    script: str
    args: list[Annotated[str, BeforeValidator(_scalar_to_str)]] = Field(default_factory=list)
    name: str | None = None
    cluster: str | ClusterSpec | None = None
    workers_per_node: int | None = Field(None, ge=1, le=MAX_GPUS_PER_NODE)
    strategy: Strategy = "ddp"
    dp: int | None = Field(None, ge=1, le=MAX_GPUS_PER_JOB)  # mesh dims; see gpufleet.parallelism
    tp: int | None = Field(None, ge=1, le=MAX_GPUS_PER_JOB)
    pp: int | None = Field(None, ge=1, le=MAX_GPUS_PER_JOB)
    pp_schedule: Schedule = "1f1b"
    microbatches: int | None = Field(None, ge=1, le=4096)
    precision: Precision = "fp32"
    framework: Framework = "torchrun"
    model: ModelShape | None = None  # for checks before start; else read from the script
    env: dict[str, Annotated[str, BeforeValidator(_scalar_to_str)]] = Field(default_factory=dict)
    max_restarts: int = Field(0, ge=0, le=100)
    hang_timeout: str = "5m"  # no rank reporting for this long counts as a hang (a failure)
    checkpoint_to: str | None = None  # durable folder or fsspec URL checkpoints are copied to
    workers: str | None = None  # elastic range MIN:MAX; see gpufleet.supervise.elastic
    scale_up_util: float = Field(0.9, gt=0, le=1)
    scale_down_util: float = Field(0.5, ge=0, lt=1)
    cooldown: str = "60s"
    scale_tolerance: float = 0.1  # a resize losing more samples/$ is reverted (goodput.py)
    keep: bool = False  # keep a cluster made for this job after the job ends
    bootstrap: bool = True  # step reports, health, error records for any script (bootstrap/)
    warm: bool = True  # workers forked from a process with torch and `preload` imported (warm.py)
    preload: Preload = Field(default_factory=list)
    total_steps: int | None = Field(None, ge=1)  # for the ETA; else read from the script's args
    loss_pattern: str | None = None  # a regex whose first group is the loss in a log line
    workdir: str | None = None  # where the script runs; the submitting shell's folder by default
    # where nodes do not see the workdir it travels (launch/workdir.py): `setup` runs once per
    # node per workdir digest; `max_upload` caps what is shipped; `keep_workdir` keeps the copy
    setup: str | None = None
    max_upload: str | None = None
    keep_workdir: bool = False
    # the queue (gpufleet/sched): higher first; the job is stopped when it runs past time_limit,
    # which is also what the queue plans with (backfill, estimated starts)
    priority: int = Field(0, ge=-100, le=100)
    time_limit: str | None = None
    after: str | None = None  # a job that must succeed first (Slurm's afterok; lifecycle.depends)
    # the image each node's launcher runs in and its options (spec_image.py, launch/container.py)
    image: ImageRef | None = None
    pull: Pull = "missing"
    container_opts: ContainerOpts = Field(default_factory=list)
    shm_size: ShmSize | None = None

    @field_validator("name", "after")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return None if v is None else check_name(v, "job")

    @field_validator("cluster", mode="before")
    @classmethod
    def _cluster(cls, v: Any) -> Any:
        if isinstance(v, str):
            return check_name(v, "cluster")
        if isinstance(v, dict):
            try:
                return ClusterSpec.parse(v)
            except SpecError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _ENV_RE.fullmatch(k)]
        if bad:
            raise ValueError(f"invalid variable name(s) {', '.join(bad)}: use letters, digits, '_'")
        owned = [k for k in v if k in _OWNED_ENV or k.startswith("GPUFLEET_")]
        if owned:
            raise ValueError(f"{', '.join(owned)} set by gpufleet (device pinning and job wiring); "
                             "pick devices with the cluster instead")
        return {k: str(val) for k, val in v.items()}

    @field_validator("loss_pattern")
    @classmethod
    def _loss_pattern(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            groups = re.compile(v).groups
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc})") from None
        if groups < 1:
            raise ValueError("needs a group around the number, e.g. 'loss=([0-9.]+)'")
        return v

    @field_validator("scale_tolerance")
    @classmethod
    def _tolerance(cls, v: float) -> float:
        if not 0 <= v < 1:  # NaN too
            raise ValueError(f"got {v}; must be at least 0 and below 1 (the share of the samples "
                             "per $ a resize may cost: 0.1 is 10%)")
        return v

    @field_validator("hang_timeout", "cooldown", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> str:
        parse_duration(v)
        return str(v)

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> str | None:
        return positive_duration(v)

    @property
    def time_limit_s(self) -> float | None:
        return None if self.time_limit is None else parse_duration(self.time_limit)

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty setup command; leave setup out for none")
        return v

    @field_validator("max_upload", mode="before")
    @classmethod
    def _max_upload(cls, v: Any) -> str | None:
        if v is None:
            return None
        size = parse_size(str(v))
        if size < MIN_MAX_UPLOAD:
            raise ValueError(f"'{excerpt(v)}' is below 1 MB; give a size such as 100MB or 1GB")
        return str(v)

    @property
    def max_upload_bytes(self) -> int:
        return DEFAULT_MAX_UPLOAD if self.max_upload is None else parse_size(self.max_upload)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, v: Any) -> str | None:
        if v is None:
            return None
        low, high = parse_workers(v)
        return f"{low}:{high}"

    @property
    def hang_timeout_s(self) -> float:
        return parse_duration(self.hang_timeout)

    @property
    def cooldown_s(self) -> float:
        return parse_duration(self.cooldown)

    @property
    def worker_range(self) -> tuple[int, int] | None:
        return parse_workers(self.workers) if self.workers else None

    def elastic_problems(self) -> list[tuple[str, str]]:
        """Rules for elastic jobs that span fields."""
        if self.workers is None:
            return []
        problems = []
        if self.scale_down_util >= self.scale_up_util:
            problems.append(("scale_down_util", f"{self.scale_down_util} must be below "
                             f"scale_up_util ({self.scale_up_util}), or the job would flap"))
        if self.framework != "torchrun":
            problems.append(("workers", f"elastic ranges run under torchrun only, not "
                             f"{self.framework}; drop --workers or use --framework torchrun"))
        if self.workers_per_node is not None:
            problems.append(("workers", "give either --workers MIN:MAX (elastic) or "
                             "--workers-per-node, not both"))
        if (self.pp or 1) > 1 or self.strategy == "pp":
            problems.append(("workers", "elastic jobs keep their global batch by gradient "
                             "accumulation, which pipeline parallelism does not support; "
                             "drop --workers or use another strategy"))
        return problems

    @field_validator("script")
    @classmethod
    def _script(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a script path is required")
        return v

    def layout(self, world_size: int) -> Layout:
        """The mesh and methods this job uses on `world_size` workers (LayoutError if none)."""
        return resolve(self.strategy, world_size, dp=self.dp, tp=self.tp, pp=self.pp,
                       precision=self.precision, schedule=self.pp_schedule,
                       microbatches=self.microbatches, framework=self.framework)

    @classmethod
    def parse(cls, data: dict[str, Any], found: Sequence[tuple[str, str]] = ()) -> Self:
        """Validate the data (no file is read); `found`: problems the caller found outside it
        (the script missing on disk, `script_file.script_problems`), reported with the rest."""
        data = {k: v for k, v in data.items() if v is not None}
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(_errors(exc) + list(found)) from None
        problems = [*found, *spec.elastic_problems(), *start_problems(spec.warm, spec.preload)]
        if problems:
            raise SpecError(problems)
        return spec
