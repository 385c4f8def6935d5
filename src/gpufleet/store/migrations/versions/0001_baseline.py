"""The schema of the versions before Alembic (SQLite schema 2): clusters, pools, reservations,
jobs, job events, metrics, findings. Nothing to do: a store reaches it by being made by those
versions (brought current by `legacy.to_baseline`) and is stamped here.

Revision ID: 0001
"""

from __future__ import annotations

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass
