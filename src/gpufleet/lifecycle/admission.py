"""Admission: every check that refuses a job before anything starts, as one pass over data.

`admit(spec, target, facts)` decides whether `spec` may run on `target` (a cluster asked for,
or one held) and returns what it decided: the layout, the first world size, the cluster and
its devices, or the refusal. It reads nothing itself; what it needs from outside (is the name
taken, is the cluster busy, the script's text) comes in as `Facts`, gathered by the caller.
So the same pass runs everywhere a job is judged:

- `submit` on a new cluster: once on the cluster the spec asks for, before the engine grants
  anything, and once on the cluster it granted (a pool can grant other nodes than were asked);
- `submit` on an existing cluster, and `resume`: once, on that cluster;
- `queued.check_queueable`: once, with nothing busy (what is busy is the queue's business).

Checks run cheapest first, in the order a user would fix them: workers per node, what the
pool can run, the job's name, the cluster's current job, the world size, then the layout.
Whether the framework is installed is a process probe, made by the caller after an admission.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import catalog
from gpufleet.backends.kinds import capabilities
from gpufleet.errors import GpufleetError, SpecError
from gpufleet.lifecycle import jobs
from gpufleet.parallelism import Layout
from gpufleet.pool.model import Placement
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.store import Cluster


@dataclass(frozen=True)
class Target:
    """The cluster a job would run on: asked for (`of_spec`) or held (`of_cluster`)."""

    name: str
    gpu: str
    count: int  # devices in all
    nodes: int
    kind: str | None  # the pool's kind; None: this host
    placements: tuple[Placement, ...] = ()  # its devices, once held

    @property
    def per_node(self) -> int:
        return self.count // self.nodes


def of_spec(cspec: ClusterSpec) -> Target:
    return Target(cspec.name or "", cspec.gpu, cspec.count, cspec.node_count, cspec.backend)


def of_cluster(cluster: Cluster, placements: list[Placement] | None = None) -> Target:
    return Target(cluster.name, cluster.gpu, cluster.count, cluster.nodes, cluster.backend,
                  tuple(placements or ()))


@dataclass(frozen=True)
class Facts:
    """What admission needs from outside, read by the caller just before it asks."""

    name_taken: bool = False  # a job or another queued job has the job's name
    busy_with: str | None = None  # the job running on the target cluster now
    source: str | None = None  # the script's text; None: unreadable, shape checks skipped
    # the cluster's nodes that do not see this machine's files (backends/shipping.py: probed
    # only where it matters, see `needs_durable`); () when they all do, or nobody asked
    unseen: tuple[str, ...] = ()
    resuming: bool = False  # `run --resume`: the job continues from its checkpoints


@dataclass(frozen=True)
class Admitted:
    """The job may run: with this layout, starting with `world` workers, on `cluster`."""

    layout: Layout
    world: int
    cluster: str
    placements: tuple[Placement, ...]  # empty while the cluster is only asked for


@dataclass(frozen=True)
class Refused:
    """The job may not run, and the one error that says why (raised by `or_raise`)."""

    error: GpufleetError


def admit(spec: JobSpec, target: Target, facts: Facts) -> Admitted | Refused:
    """Decide whether `spec` may run on `target`; pure."""
    from gpufleet import preflight

    assert spec.name is not None
    try:
        check_workers(spec, target.per_node, target.name)
        check_pool_job(spec, target.kind, target.nodes)
        if facts.name_taken:
            raise jobs.name_taken_error(spec.name)
        if facts.busy_with is not None:
            raise jobs.busy_error(target.name, facts.busy_with)
        check_durable(spec, facts.unseen, facts.resuming, target.name)
        world = first_world(spec, target.count, target.name, target.nodes)
        layout = preflight.check(spec, catalog.resolve_gpu(target.gpu), world, facts.source)
    except GpufleetError as exc:
        return Refused(exc)
    return Admitted(layout, world, target.name, target.placements)


def or_raise(decision: Admitted | Refused) -> Admitted:
    if isinstance(decision, Refused):
        raise decision.error
    return decision


def check_workers(spec: JobSpec, per_node: int, cluster_name: str) -> None:
    if spec.workers_per_node is not None and spec.workers_per_node > per_node:
        raise SpecError([("workers_per_node", f"{spec.workers_per_node} workers per node need as "
                          f"many devices, but cluster {cluster_name} has {per_node} per node; use "
                          f"1 to {per_node}")])


def check_pool_job(spec: JobSpec, kind: str | None, nodes: int) -> None:
    """What a job on a pool other than this host cannot do, refused before anything starts."""
    from gpufleet.launch.frameworks import MULTI_NODE_FRAMEWORKS

    caps = capabilities(kind)
    if not caps.runs_jobs:
        raise SpecError([("cluster", "a simulated pool only plans and reserves; run jobs on the "
                          "local pool or a Ray pool (--pool local, or gpufleet pool up --local)")])
    if not caps.this_host or nodes > 1:
        if spec.framework not in MULTI_NODE_FRAMEWORKS:
            raise SpecError([("framework", f"'{spec.framework}' runs on this host's pool only; "
                              f"on a Ray pool allowed: {', '.join(MULTI_NODE_FRAMEWORKS)}")])
        if spec.worker_range is not None:
            raise SpecError([("workers", "elastic resizing runs on the local pool only; on a "
                              "Ray pool, --max-restarts replaces a lost node instead")])
    elif spec.worker_range is not None and not caps.elastic:
        raise SpecError([("workers", "elastic resizing runs on the local pool only")])


def needs_durable(spec: JobSpec, resuming: bool) -> bool:
    """Whether the job would read its checkpoints back on a later run (a restart, a resume)
    without a durable copy: only then does it matter whether the nodes share files."""
    return (spec.max_restarts > 0 or resuming) and not spec.checkpoint_to


def check_durable(spec: JobSpec, unseen: tuple[str, ...], resuming: bool, cluster: str) -> None:
    """Where nodes do not share this machine's files, each keeps its checkpoints on its own
    disk, and a restart or a resume on other nodes would start from nothing: refused, with the
    fix, before anything starts (issue 29)."""
    if not unseen or not needs_durable(spec, resuming):
        return
    why = "--resume" if resuming else f"--max-restarts {spec.max_restarts}"
    raise SpecError([("checkpoint_to", f"node(s) {', '.join(unseen)} of cluster {cluster} do "
                      "not see this machine's files, so checkpoints stay on each node's disk "
                      f"and {why} could not continue from them on another node; give "
                      "--checkpoint-to URL, a durable folder all nodes see (any fsspec URL)")])


def first_world(spec: JobSpec, devices: int, cluster: str, nodes: int = 1) -> int:
    """Workers the job starts with: one per device (or --workers-per-node), or for an elastic
    job the largest size in its range that the cluster's devices allow."""
    from gpufleet.supervise.elastic import elastic_plan

    if spec.worker_range is None:
        return spec.workers_per_node * nodes if spec.workers_per_node else devices
    policy, allowed, first = elastic_plan(spec, devices)
    assert policy is not None
    if not allowed:
        raise SpecError([("workers", f"no size in {spec.workers} suits the job: a size must "
                          f"divide {policy.max_workers} (the global batch is fixed at the "
                          "largest size) and fit its layout")])
    if first > devices:
        raise SpecError([("workers", f"{spec.workers} needs at least {allowed[0]} device(s); "
                          f"cluster {cluster} has {devices} (use --count {allowed[0]} or more)")])
    return first
