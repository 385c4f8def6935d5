"""Submitting a job and resuming one: the admission pass (`lifecycle.admission`) with what it
reads gathered here, then the job record on its cluster (an existing one, or one made for it).

What the CLI's `run` and `run --resume` do, as functions an API server can call too. Starting
the supervisor is `lifecycle.runs`; nothing here prints or asks.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.backends.kinds import capabilities
from gpufleet.errors import ConflictError, GpufleetError, SpecError
from gpufleet.lifecycle import clusters, images, jobs
from gpufleet.lifecycle.admission import (
    Facts,
    Refused,
    admit,
    needs_durable,
    of_cluster,
    of_spec,
    or_raise,
)
from gpufleet.lifecycle.provision import Approve, allocation, provision
from gpufleet.lifecycle.say import told
from gpufleet.parallelism import Layout
from gpufleet.pool.model import Placement
from gpufleet.script_file import parse_job_here
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Job, Store, gpufleet_home


@dataclass(frozen=True)
class DryRun:
    """What `submit` would start, node by node, with nothing started or reserved."""

    spec: JobSpec  # named
    layout: Layout
    placements: list[Placement]
    cluster: str
    fabric: str
    engine_lines: tuple[str, ...] = ()  # an allocating engine's own commands (sbatch, srun)
    this_host: bool = True  # its supervisor starts the workers from the caller's environment


def script_source(spec: JobSpec) -> str | None:
    """The job's script as text, for admission's shape checks; None when it is not Python
    text we can read (those checks are then skipped)."""
    try:
        return (Path(spec.workdir or ".") / spec.script).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def facts(store: Store, spec: JobSpec, cluster: Cluster | None, queued_ok: bool = False,
          own_name: bool = False) -> Facts:
    """What admission reads from the store and the disk about `spec` on `cluster` (None: a
    cluster not made yet). `queued_ok`: the queue's entry of that name is this job;
    `own_name`: the name is the job's own (a resume), not a new one to check."""
    assert spec.name is not None
    return Facts(name_taken=not own_name and jobs.name_taken(store, spec.name, queued_ok),
                 busy_with=None if cluster is None else jobs.busy_with(store, cluster),
                 source=script_source(spec), unseen=unseen_nodes(store, spec, cluster, own_name),
                 resuming=own_name)


def unseen_nodes(store: Store, spec: JobSpec, cluster: Cluster | None,
                 resuming: bool) -> tuple[str, ...]:
    """The cluster's nodes that do not see this machine's files, probed by its engine
    (backends/shipping.py) only when the answer can refuse the job (`needs_durable`): a probe
    is a round trip to every node (a Ray task each, one Slurm step)."""
    from gpufleet.backends import shipping
    from gpufleet.lifecycle import pools

    if cluster is None or capabilities(cluster.backend).this_host \
            or not needs_durable(spec, resuming):
        return ()
    engine = pools.backend_for(pools.pool_of(store, cluster))
    node_ids = list(dict.fromkeys(p.node_id for p in clusters.placements(store, cluster)))
    found = shipping.probe(engine, node_ids, gpufleet_home() / "jobs", cluster.engine_ref or "")
    return () if found is None else found.unseen


def check_framework(spec: JobSpec) -> None:
    """Refuse a job whose framework is not installed for the job's Python: a process probe, so
    it comes after an admission (a dry run, which starts nothing, does not need it)."""
    from gpufleet import preflight as checks

    module = checks.FRAMEWORK_MODULES.get(spec.framework, ("",))[0]
    found = {module} if module and _importable(module) else set()
    problem = checks.missing_framework(spec.framework, found)
    if spec.framework == "horovod" and not problem and not shutil.which("horovodrun"):
        problem = "horovodrun is not on PATH; install horovod with its launcher"
    if problem:
        raise SpecError([("framework", problem)])


def check_environment(spec: JobSpec, kind: str | None,
                      say: Callable[[str], None] | None = None) -> None:
    """Refuse, before anything is reserved, a job whose environment cannot run it. A job in an
    image is checked against the image where its node is this machine (the local pool: the
    node's own preflight, run here now, so a missing image or one without torch is exit 2 with
    nothing held); other pools' nodes are not this machine: the nodes an SSH pool would grant are
    asked before the grant (`images.check_before_grant`), and every node checks itself again
    before its workers start (NodeAgent.start). A job without an image needs its framework importable by
    this host's Python; a job in one does not (the image holds the framework)."""
    if not spec.image:
        check_framework(spec)
        return
    if not capabilities(kind).this_host:
        return
    from gpufleet.backends.image_preflight import preflight
    from gpufleet.backends.local import NODE_ID
    from gpufleet.launch.container import container_of

    c = container_of(spec, spec.name or "")
    assert c is not None
    preflight(c, NODE_ID, told(say))


def _importable(module: str) -> bool:
    """Whether the job's Python can import `module`, tried in a child process: importing Ray or
    Horovod here would be slow, and a broken install can fail in any way."""
    try:
        probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                               timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def parse_job(store: Store, data: dict[str, Any]) -> JobSpec:
    """A job spec sent as data (the API's POST /jobs), with a new cluster's pool resolved
    against this store as `run` resolves it, and its script looked for on this machine."""
    from gpufleet.lifecycle.provision import with_pool

    if isinstance(data.get("cluster"), dict):
        data = {**data, "cluster": with_pool(store, data["cluster"])}
    return parse_job_here(data)


def submit(store: Store, spec: JobSpec, approve: Approve, cpu_slots: int | None = None,
           dry_run: bool = False, owner: tuple[str, str | None] | None = None,
           from_queue: bool = False,
           say: Callable[[str], None] | None = None) -> tuple[Job, Cluster] | DryRun:
    """Admit the job (`admission.admit`), make its cluster if the spec describes one (after
    `approve`) and admit it again on what was granted, and create its record, ready for a
    supervisor. A refused job leaves no cluster made for it behind. `owner`: (user, team) it
    is billed to; `from_queue`: the queue starts its own entry; `say`: hears an engine's
    pending reasons while it waits for a grant."""
    spec = spec.model_copy(update={"name": jobs.job_name_for(spec)})  # fixed once, used twice
    spec = images.with_image(store, spec)  # the cluster's or pool's image, when it has none
    assert spec.name is not None
    made_here = isinstance(spec.cluster, ClusterSpec)
    if isinstance(spec.cluster, ClusterSpec):
        cspec = spec.cluster
        if cspec.name is None:
            cspec = cspec.model_copy(update={"name": clusters.new_name("run")})
        if cspec.time_limit is None and spec.time_limit_s is not None:
            # the cluster outlives the job's own limit by the time its stop takes (a last
            # checkpoint, the clean-up), so the engine never cuts that short
            cspec = cspec.model_copy(update={"time_limit": f"{spec.time_limit_s + 120:.0f}s"})
        decided = or_raise(admit(spec, of_spec(cspec), facts(store, spec, None, from_queue)))
        if dry_run:
            placements, fabric = allocation(store, cspec, cpu_slots)
            return DryRun(spec, decided.layout, placements, cspec.name or "", fabric,
                          engine_lines(store, spec, cspec, None, placements),
                          capabilities(cspec.backend).this_host)
        check_environment(spec, cspec.backend, say)
        images.check_before_grant(store, spec, cspec, cpu_slots, say)
        cluster = provision(store, cspec, approve, cpu_slots, for_job=spec.name,
                            user=owner[0] if owner else None, say=say)
        # the pool may grant other nodes than were asked for: the same pass on what it granted
        granted = admit(spec, of_cluster(cluster, clusters.placements(store, cluster)),
                        facts(store, spec, cluster, from_queue))
        if isinstance(granted, Refused):
            clusters.stop(store, cluster.name, reason="job refused", cluster_id=cluster.id)
            raise granted.error
        decided = granted
    else:
        assert spec.cluster is not None
        cluster = clusters.get(store, spec.cluster)
        if cluster.status not in clusters.ACTIVE:
            raise ConflictError(f"cluster: '{cluster.name}' is {cluster.status}; launch a new one")
        decided = or_raise(admit(spec, of_cluster(cluster, clusters.placements(store, cluster)),
                                 facts(store, spec, cluster, from_queue)))
        if dry_run:
            found = list(decided.placements)
            return DryRun(spec, decided.layout, found, cluster.name, cluster.network,
                          engine_lines(store, spec, None, cluster, found),
                          capabilities(cluster.backend).this_host)
        check_environment(spec, cluster.backend, say)
        images.check_on_nodes(store, spec, cluster, say)
    try:
        job = jobs.create(store, spec, cluster, decided.world, owner)
    except GpufleetError:
        if made_here:
            clusters.stop(store, cluster.name, reason="job could not be created",
                          cluster_id=cluster.id)
        raise
    return job, cluster


def engine_lines(store: Store, spec: JobSpec, cspec: ClusterSpec | None,
                 cluster: Cluster | None, placements: list[Placement]) -> tuple[str, ...]:
    """On an engine that allocates (Slurm): the sbatch a new cluster would submit (`cspec`) or
    the allocation an existing one holds, and the srun step per node; () elsewhere."""
    from gpufleet.backends.alloc import Ask
    from gpufleet.lifecycle import engine_alloc

    kind = cspec.backend if cspec is not None else cluster.backend if cluster else None
    if not capabilities(kind).allocates:
        return ()
    pool = cspec.pool if cspec is not None else cluster.pool if cluster else None
    engine = engine_alloc.allocator(store, pool)
    if engine is None:
        return ()
    ask = None if cspec is None else Ask(
        cspec.name or "", cspec.gpu, cspec.count, cspec.node_count, cspec.time_limit_s,
        spares=cspec.spares)
    job_id = cluster.engine_ref if cluster is not None and cluster.engine_ref else "$JOB_ID"
    job_dir = gpufleet_home() / "jobs" / (spec.name or "")
    return tuple(engine.dry_run(ask, job_id, [p.node_id for p in placements], job_dir))


def resume_note(store: Store, job: Job, spec: JobSpec) -> str:
    """What resuming `job` starts from (`resume_words`): gpufleet's newest complete
    checkpoint of it, in its folder or its durable folder, or the newest step its events say
    was copied to a durable URL (not listed here: that would be a network call)."""
    from gpufleet import durable_copy
    from gpufleet.train import ckpt_files

    found = [(step, str(path)) for step, path in
             ckpt_files.complete(Path(job.job_dir) / "checkpoints")]
    if spec.checkpoint_to and not ckpt_files.is_url(spec.checkpoint_to):
        found += [(step, str(path)) for step, path in
                  ckpt_files.complete(Path(spec.checkpoint_to))]
    elif spec.checkpoint_to:
        copy = durable_copy.state((e.kind, e.reason) for e in jobs.events(store, job.id))
        if copy is not None and copy.step is not None:
            found.append((copy.step, spec.checkpoint_to))
    newest = max(found, key=lambda f: f[0], default=None)
    return resume_words(newest, [spec.script, *spec.args], spec.workdir or ".")


def resume_words(newest: tuple[int, str] | None, command: Sequence[str], workdir: str) -> str:
    """What `run --resume` will start from, said before it starts, as plainly as a restart's
    note (`supervise.restarts.resumes_from`): `newest` is gpufleet's newest checkpoint of the
    job (step, where), which its Checkpointer loads. Without one gpufleet resumes nothing: the
    script runs again with the arguments it was first given, so it starts from scratch unless
    those make it load files of its own (nanoGPT's `init_from`, a tutorial's snapshot file)."""
    if newest is not None:
        step, where = newest
        return (f"from gpufleet's checkpoint at step {step} ({where}), or the one before it if "
                "that one is found damaged")
    return ("gpufleet holds no checkpoint of it: the script runs again as first started, "
            f"{shlex.join(command)} in {workdir}, and starts from scratch unless it resumes "
            "from files of its own")


def resume(store: Store, name: str, approve: Approve, cpu_slots: int | None = None,
           say: Callable[[str], None] | None = None,
           waiting: Callable[[str], None] | None = None) -> tuple[Job, Cluster]:
    """An ended job reopened on its cluster (made again, after `approve`, if it was made for
    the job), to continue from gpufleet's newest checkpoint of it if there is one; `say` hears
    which (`resume_note`) before anything is reserved; `waiting`, an engine's pending reasons
    while it grants the cluster again."""
    job = jobs.get(store, name)
    if job.status in jobs.ACTIVE:
        raise ConflictError(f"resume: job '{name}' is {job.status}; stop it first "
                            f"(gpufleet stop {name}) or follow it (gpufleet logs {name} -f)")
    if job.status == JobStatus.SUCCEEDED:
        raise ConflictError(f"resume: job '{name}' already succeeded; nothing to resume")
    spec = jobs.spec_of(job)
    note = resume_note(store, job, spec)
    if say is not None:
        say(note)
    with store.read() as s:
        old = s.get(Cluster, job.cluster_id)
    assert old is not None
    if old.status in clusters.ACTIVE:
        cluster = old
    elif old.for_job == job.name:
        cspec = ClusterSpec.model_validate_json(old.spec_json).model_copy(update={"name": old.name})
        cluster = provision(store, cspec, approve, cpu_slots, for_job=job.name, say=waiting)
    else:
        cluster = clusters.get(store, old.name)
        if cluster.status not in clusters.ACTIVE:
            raise ConflictError(f"cluster: job '{name}' ran on cluster '{old.name}', which is "
                                f"stopped; launch one with that name (gpufleet launch --name "
                                f"{old.name} ...) and resume again")
    try:
        decided = or_raise(admit(spec, of_cluster(cluster),
                                 facts(store, spec, cluster, own_name=True)))
        check_environment(spec, cluster.backend, say)
        images.check_on_nodes(store, spec, cluster, say)
        job = jobs.reopen(store, job, cluster, decided.world,
                          f"resumed by gpufleet run --resume, {note}")
    except GpufleetError:
        if cluster.for_job == job.name and cluster.id != old.id:
            clusters.stop(store, cluster.name, reason="job could not resume", cluster_id=cluster.id)
        raise
    return job, cluster
