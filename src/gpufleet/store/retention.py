"""Downsampling, so a week-long job's telemetry stays small.

Samples are kept as they came for the last minutes (the live charts), then as means over
ever wider buckets. The tiers are data; `compact` applies them to one job in one transaction.
A series sampled once a second for a week keeps about 4,700 rows instead of 605,000.
"""

from __future__ import annotations

import math

from sqlalchemy import text

from gpufleet.store.db import Store

# (age in seconds after which a sample is merged, bucket seconds it is merged into)
TIERS: tuple[tuple[float, float], ...] = ((600.0, 10.0), (6 * 3600.0, 60.0), (86400.0, 600.0))


def cuts(now: float, tiers: tuple[tuple[float, float], ...] = TIERS) -> list[tuple[float, float]]:
    """(cut-off time, bucket) per tier: rows older than the cut-off, finer than the bucket, are
    merged. The cut-off falls on a bucket edge so a bucket is never split across two rounds."""
    return [(max(0.0, math.floor((now - age) / bucket) * bucket), bucket) for age, bucket in tiers]


def rows_bound(duration_s: float, interval_s: float = 1.0, compact_every_s: float = 60.0,
               tiers: tuple[tuple[float, float], ...] = TIERS) -> int:
    """The most rows one series sampled every `interval_s` for `duration_s` keeps, compacted
    every `compact_every_s` (samples since the last round are still raw, and a bucket at each
    tier edge may be partly filled, hence the +2 per tier)."""
    total, edge, step = compact_every_s / interval_s, 0.0, interval_s
    for age, bucket in tiers:
        span = max(0.0, min(duration_s, age) - edge)
        total += span / step + 2
        edge, step = max(edge, age), bucket
    total += max(0.0, duration_s - edge) / step + 2
    return math.ceil(total)


# The bucket a sample falls in. Times are >= 0, so SQLite's CAST (which truncates) floors;
# PostgreSQL's CAST rounds, so it is told to floor.
_BUCKET_OF = {"sqlite": "CAST(time / :bucket AS INTEGER)", "postgresql": "floor(time / :bucket)"}
# `job` is grouped by too (one value here) because PostgreSQL wants every selected column to be.
_MERGE = """
INSERT INTO metrics (time, cluster, job, node, rank, name, value, device, resolution)
SELECT avg(time), cluster, job, node, rank, name, avg(value), device, :bucket
FROM metrics
WHERE job = :job AND time < :cut AND coalesce(resolution, 0) < :bucket
GROUP BY cluster, job, node, rank, device, name, {bucket_of}
"""
_DROP = text("""
DELETE FROM metrics
WHERE job = :job AND time < :cut AND coalesce(resolution, 0) < :bucket AND id <= :last
""")
_LAST = text("SELECT coalesce(max(id), 0) FROM metrics")


def compact(store: Store, job: str, now: float) -> None:
    """Merge the job's old samples into their tiers' buckets (means of time and value)."""
    with store.session() as s:
        merge = text(_MERGE.format(bucket_of=_BUCKET_OF[s.get_bind().dialect.name]))
        for cut, bucket in cuts(now):
            last = s.execute(_LAST).scalar_one()
            params = {"job": job, "cut": cut, "bucket": bucket, "last": last}
            s.execute(merge, params)
            s.execute(_DROP, params)
