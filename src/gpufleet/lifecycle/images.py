"""Which image a job runs in.

An image is asked for at three levels, the nearest winning: the job's own (`--image`,
`image:`), its cluster's (`launch --image`: every job on that cluster), its pool's (`pool add
... --image`: every job carved from that pool). `with_image` writes the one that applies into
the job's spec before admission, so the job record, `status`, a resume and the node plans all
read the same image (a pool changed later does not change a job already submitted).
"""

from __future__ import annotations

import json

from gpufleet.errors import NotFoundError
from gpufleet.lifecycle import clusters, pools
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.store import Store


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
