"""A cluster's allocation in its engine (the Slurm job that holds its nodes), so `stop` and a
heal release exactly it.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("clusters")}
    if "engine_ref" not in columns:
        with op.batch_alter_table("clusters") as clusters:
            clusters.add_column(sa.Column("engine_ref", sa.String(64), nullable=True))

