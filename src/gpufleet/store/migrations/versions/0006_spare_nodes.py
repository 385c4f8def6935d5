"""Spare nodes: a reservation may hold a whole node beside its cluster's own (`--spares N`),
kept free for a lost node to be replaced by at once, and a cluster counts the spares it holds
now (billed with it: the ledger's rows book their devices too). Existing rows hold none.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("reservations")}
    if "spare" not in columns:
        with op.batch_alter_table("reservations") as reservations:
            reservations.add_column(sa.Column("spare", sa.Boolean(), nullable=False,
                                              server_default=sa.false()))
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("clusters")}
    if "spares" not in columns:
        with op.batch_alter_table("clusters") as clusters:
            clusters.add_column(sa.Column("spares", sa.Integer(), nullable=False,
                                          server_default="0"))
