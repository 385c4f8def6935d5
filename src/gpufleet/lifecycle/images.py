"""Which image a job runs in.

An image is asked for at three levels, the nearest winning: the job's own (`--image`,
`image:`), its cluster's (`launch --image`: every job on that cluster), its pool's (`pool add
... --image`: every job carved from that pool). `with_image` writes the one that applies into
the job's spec before admission, so the job record, `status`, a resume and the node plans all
read the same image (a pool changed later does not change a job already submitted).
`check_before_grant` and `check_on_nodes` ask a pool's nodes whether the image runs there
before anything is reserved or the job exists (backends/image_nodes.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from gpufleet.errors import ImageError, NotFoundError
from gpufleet.lifecycle import clusters, pools
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.store import Cluster, Store


def pool_image(store: Store, pool: str | None, backend: str | None = None) -> str | None:
    """The pool's default image (`pool add --image`); None for this host and pools without."""
    try:
        row = pools.resolve(store, pool, backend)
    except NotFoundError:  # a cluster's pool removed since: nothing to default to
        return None
    if row is None:
        return None
    image = json.loads(row.spec_json or "{}").get("image")
    return str(image) if image else None


def with_image(store: Store, spec: JobSpec) -> JobSpec:
    """`spec` with the image that applies to it written in (unchanged when none does)."""
    if spec.image:
        return spec
    if isinstance(spec.cluster, ClusterSpec):
        image = spec.cluster.image or pool_image(store, spec.cluster.pool, spec.cluster.backend)
    elif spec.cluster is not None:
        row = clusters.get(store, spec.cluster)
        own = ClusterSpec.model_validate_json(row.spec_json).image if row.spec_json else None
        image = own or pool_image(store, row.pool, row.backend)
    else:
        image = None
    return spec.model_copy(update={"image": image}) if image else spec



def check_before_grant(store: Store, spec: JobSpec, cspec: ClusterSpec,
                       cpu_slots: int | None = None,
                       say: Callable[[str], None] | None = None) -> None:
    """Raise ImageError (exit 2), one line per failing node, when the job's image does not pass
    its preflight on the nodes the pool would grant `cspec` now (asked of an engine that can
    reach them before a grant: an SSH pool's hosts), so a missing image reserves nothing.
    Nothing for a job without an image, this host (`check_environment` asks it) or an engine
    whose nodes check as the run starts; a grant that then lands elsewhere (a race) is checked
    there at start."""
    from gpufleet.backends import image_nodes

    if not spec.image:
        return
    pool = pools.resolve(store, cspec.pool, cspec.backend)
    if pool is None:
        return
    engine = pools.backend_for(pool, cpu_slots)
    if not isinstance(engine, image_nodes.ChecksImages):
        return
    alloc = clusters.check(store, cspec, engine.discover(), pool.name)
    _check(engine, [p.node_id for p in alloc.placements], spec, "", say)


def check_on_nodes(store: Store, spec: JobSpec, cluster: Cluster,
                   say: Callable[[str], None] | None = None) -> None:
    """As `check_before_grant`, on the nodes of a cluster that holds them already (a job on a
    launched cluster, a resume)."""
    from gpufleet.backends.kinds import capabilities

    if not spec.image or capabilities(cluster.backend).this_host:
        return
    engine = pools.backend_for(pools.pool_of(store, cluster))
    held = clusters.placements(store, cluster) + clusters.spares(store, cluster)  # spares: pulled
    _check(engine, [p.node_id for p in held], spec,
           cluster.engine_ref or "", say)


def _check(engine: object, node_ids: list[str], spec: JobSpec, ref: str,
           say: Callable[[str], None] | None) -> None:
    from gpufleet.backends import image_nodes
    from gpufleet.launch.container import container_of

    container = container_of(spec, spec.name or "")
    assert container is not None
    failed = image_nodes.failures(engine, list(dict.fromkeys(node_ids)), container.to_json(),
                                  ref, say)
    if failed:
        raise ImageError("; ".join(failed))
