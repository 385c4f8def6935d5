"""The queue, users, teams, quotas, budgets, the audit trail and the ledger; who a job (and a
cluster launched through a server) belongs to.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # store/models.py's Int64


def _table(name: str, *columns: sa.Column[object] | sa.UniqueConstraint) -> None:
    # A store from a development build of this revision may have some tables already.
    if name not in sa.inspect(op.get_bind()).get_table_names():
        op.create_table(name, *columns)


def _columns(table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}


def upgrade() -> None:
    if "user" not in _columns("jobs"):
        with op.batch_alter_table("jobs") as jobs:
            jobs.add_column(sa.Column("user", sa.String(64), nullable=True))
            jobs.add_column(sa.Column("team", sa.String(64), nullable=True))
            jobs.create_index("ix_jobs_user", ["user"])
    if "queue" in sa.inspect(op.get_bind()).get_table_names() and \
            "env_json" not in _columns("queue"):
        op.add_column("queue", sa.Column("env_json", sa.Text(), nullable=True))
    if "user" not in _columns("clusters"):
        with op.batch_alter_table("clusters") as clusters:
            clusters.add_column(sa.Column("user", sa.String(64), nullable=True))
    _table(
        "users",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("team", sa.String(64), nullable=True),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float(), nullable=False))
    _table(
        "teams",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float(), nullable=False))
    _table(
        "budgets",
        sa.Column("id", ID, primary_key=True),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("month", sa.String(7), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.UniqueConstraint("team", "month"))
    _table(
        "quotas",
        sa.Column("id", ID, primary_key=True),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("gpu", sa.String(32), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.UniqueConstraint("team", "gpu"))
    _table(
        "queue",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("user", sa.String(64), nullable=False, index=True),
        sa.Column("team", sa.String(64), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("cpu_slots", sa.Integer(), nullable=True),
        sa.Column("env_json", sa.Text(), nullable=True),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("gpu", sa.String(32), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(64), nullable=True),
        sa.Column("usd_per_hour", sa.Float(), nullable=False),
        sa.Column("time_limit_s", sa.Float(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("wait", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("est_start", sa.Float(), nullable=True),
        sa.Column("decided_at", sa.Float(), nullable=True),
        sa.Column("left_at", sa.Float(), nullable=True))
    _table(
        "audit",
        sa.Column("id", ID, primary_key=True),
        sa.Column("time", sa.Float(), nullable=False, index=True),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(96), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False))
    _table(
        "ledger",
        sa.Column("id", ID, primary_key=True),
        sa.Column("job_id", ID, sa.ForeignKey("jobs.id"), nullable=False, index=True),
        sa.Column("job", sa.String(64), nullable=False),
        sa.Column("user", sa.String(64), nullable=False, index=True),
        sa.Column("team", sa.String(64), nullable=True),
        sa.Column("gpu", sa.String(32), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("price_book", sa.String(32), nullable=True),
        sa.Column("usd_per_hour", sa.Float(), nullable=False),
        sa.Column("start", sa.Float(), nullable=False),
        sa.Column("end", sa.Float(), nullable=False, index=True),
        sa.Column("micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("open", sa.Boolean(), nullable=False))
