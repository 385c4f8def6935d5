"""Every billed second in the ledger: a job's runs with its cluster's cost meter read at both
ends (`job_runs`), a job's cost over all its runs (`jobs.billed_micro_usd`,
`run_from_micro_usd`), rows for a cluster's idle time (`ledger.job_id` may be empty; rows name
their cluster), and clusters settled once booked in full (plan/billing.py, lifecycle/ledger.py).

Existing jobs keep the cost they showed: each gets one run on the cluster it is on, worth that
cost (the clusters of a resumed job's earlier runs were never recorded). Its rows of that run
(those from its window's start, as the ledger booked them) are tied to that cluster; older
rows stay as they are, naming no cluster. A stopped cluster whose jobs are all booked is
settled as it is; the others (running, or holding a job never booked) are booked from now on,
idle time included.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # store/models.py's Int64
ACTIVE_JOBS = ("starting", "running", "restarting", "resizing")
ACTIVE_CLUSTERS = ("pending", "running")

clusters = sa.table("clusters", sa.column("id"), sa.column("name"), sa.column("status"),
                    sa.column("usd_per_hour"), sa.column("started_at"), sa.column("stopped_at"),
                    sa.column("banked_usd"), sa.column("rate_since"), sa.column("settled"))
jobs = sa.table("jobs", sa.column("id"), sa.column("cluster_id"), sa.column("status"),
                sa.column("created_at"), sa.column("ended_at"), sa.column("billed_micro_usd"),
                sa.column("run_from_micro_usd"))
runs = sa.table("job_runs", sa.column("job_id"), sa.column("cluster_id"), sa.column("start"),
                sa.column("end"), sa.column("from_micro_usd"), sa.column("to_micro_usd"))
ledger = sa.table("ledger", sa.column("id"), sa.column("job_id"), sa.column("start"),
                  sa.column("open"), sa.column("cluster_id"), sa.column("cluster"))


def _columns(table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}


def upgrade() -> None:
    if "job_runs" not in sa.inspect(op.get_bind()).get_table_names():
        op.create_table(
            "job_runs",
            sa.Column("id", ID, primary_key=True),
            sa.Column("job_id", ID, sa.ForeignKey("jobs.id"), nullable=False, index=True),
            sa.Column("cluster_id", ID, sa.ForeignKey("clusters.id"), nullable=False,
                      index=True),
            sa.Column("start", sa.Float(), nullable=False),
            sa.Column("end", sa.Float(), nullable=True),
            sa.Column("from_micro_usd", sa.BigInteger(), nullable=False),
            sa.Column("to_micro_usd", sa.BigInteger(), nullable=True))
    if "billed_micro_usd" in _columns("jobs"):
        return  # a store from a development build of this revision
    with op.batch_alter_table("jobs") as t:
        t.add_column(sa.Column("billed_micro_usd", sa.BigInteger(), nullable=False,
                               server_default="0"))
        t.add_column(sa.Column("run_from_micro_usd", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("clusters") as t:
        t.add_column(sa.Column("settled", sa.Boolean(), nullable=True))
    with op.batch_alter_table("ledger") as t:
        t.alter_column("job_id", existing_type=ID, nullable=True)
        t.alter_column("job", existing_type=sa.String(64), nullable=True)
        t.add_column(sa.Column("cluster_id", ID, sa.ForeignKey("clusters.id",
                                                               name="fk_ledger_cluster_id"),
                               nullable=True))
        t.add_column(sa.Column("cluster", sa.String(64), nullable=True))
        t.create_index("ix_ledger_cluster_id", ["cluster_id"])
    _backfill(op.get_bind(), time.time())


def _accrued(c: sa.Row[tuple[object, ...]], start: float, end: float | None, now: float) -> float:
    """plan.cost.accrued_usd as this revision found it (kept here: a migration must not change
    with the code after it)."""
    stop = end if end is not None else now
    rate = float(c.usd_per_hour or 0.0)
    if c.rate_since is not None:
        since = float(c.rate_since)
        return float(c.banked_usd or 0.0) + rate * max(0.0, stop - max(start, since)) / 3600
    return rate * max(0.0, stop - start) / 3600


def _backfill(conn: sa.Connection, now: float) -> None:
    by_id = {c.id: c for c in conn.execute(sa.select(clusters))}
    unbooked = {r.cluster_id for r in conn.execute(  # a job with no row, or with rows still open
        sa.select(jobs.c.cluster_id).where(
            ~jobs.c.id.in_(sa.select(ledger.c.job_id).where(ledger.c.job_id.is_not(None)))
            | jobs.c.id.in_(sa.select(ledger.c.job_id).where(ledger.c.open.is_(True)))))}
    for j in conn.execute(sa.select(jobs)):
        c = by_id.get(j.cluster_id)
        if c is None or c.started_at is None:
            continue
        # the window and cost `supervise.view.job_cost_usd` gave before this revision
        start = max(j.created_at, c.started_at)
        ends = [t for t in (j.ended_at, c.stopped_at) if t is not None]
        end = max(start, min(ends)) if ends else None
        spent = round(_accrued(c, start, min(ends) if ends else None, now) * 1_000_000)
        meter = round(_accrued(c, c.started_at, c.stopped_at, now) * 1_000_000)
        if j.status in ACTIVE_JOBS:
            reading = meter - spent
            conn.execute(sa.update(jobs).where(jobs.c.id == j.id).values(
                billed_micro_usd=0, run_from_micro_usd=reading))
            conn.execute(sa.insert(runs).values(job_id=j.id, cluster_id=c.id, start=start,
                                                end=None, from_micro_usd=reading))
        else:
            before = round(_accrued(c, c.started_at, start, now) * 1_000_000)
            conn.execute(sa.update(jobs).where(jobs.c.id == j.id).values(
                billed_micro_usd=spent, run_from_micro_usd=None))
            conn.execute(sa.insert(runs).values(job_id=j.id, cluster_id=c.id, start=start,
                                                end=end, from_micro_usd=before,
                                                to_micro_usd=before + spent))
        conn.execute(sa.update(ledger).where(ledger.c.job_id == j.id, ledger.c.start >= start)
                     .values(cluster_id=c.id, cluster=c.name))
    for c in by_id.values():
        settled = c.status not in ACTIVE_CLUSTERS and c.id not in unbooked
        conn.execute(sa.update(clusters).where(clusters.c.id == c.id).values(settled=settled))
