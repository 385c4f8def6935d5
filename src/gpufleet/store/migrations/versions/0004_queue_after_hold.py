"""A queued job's dependency (`--after`), who held it (`gpufleet hold`), and why its estimated
start cannot be told.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("queue")}
    new = [sa.Column("after", sa.String(64), nullable=True),
           sa.Column("held_by", sa.String(64), nullable=True),
           sa.Column("start_note", sa.Text(), nullable=True)]
    for column in new:
        if column.name not in columns:
            op.add_column("queue", column)

