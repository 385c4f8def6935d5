"""How versions before Alembic kept their state files current, frozen at the baseline (revision
0001): the clusters' `pool` column, the reservations keyed by (pool, node, device), and every
column of the baseline's tables added in place (nullable, so old rows read as unknown).

Only the baseline's tables and columns: what came later is a revision in `versions/`.
"""

from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from gpufleet.store.models import Base

BASELINE_TABLES = ("clusters", "pools", "reservations", "jobs", "job_events", "metrics",
                   "findings")
AFTER_BASELINE = {("jobs", "user"), ("jobs", "team"), ("clusters", "user"),  # from 0002 on
                  ("jobs", "billed_micro_usd"), ("jobs", "run_from_micro_usd"),  # 0005
                  ("clusters", "settled"), ("reservations", "spare"),
                  ("clusters", "spares")}  # 0006


def _rekey_reservations(conn: Connection) -> None:
    """Reservations were unique by (node, device); with several pools they are unique by (pool,
    node, device). A constraint cannot be altered in SQLite, so the table is rebuilt, its rows
    (the devices running clusters hold) copied with their cluster's pool."""
    inspector = inspect(conn)
    if "reservations" not in inspector.get_table_names():
        return
    keys = [sorted(u["column_names"]) for u in inspector.get_unique_constraints("reservations")]
    if ["device_id", "node_id"] not in keys:
        return
    conn.exec_driver_sql("ALTER TABLE reservations RENAME TO reservations_v1")
    Base.metadata.tables["reservations"].create(conn)
    conn.exec_driver_sql(
        "INSERT INTO reservations (id, cluster_id, node_id, address, device_id, device_index, pool) "
        "SELECT r.id, r.cluster_id, r.node_id, r.address, r.device_id, r.device_index, "
        "COALESCE(c.pool, 'local') FROM reservations_v1 r JOIN clusters c ON c.id = r.cluster_id")
    conn.exec_driver_sql("DROP TABLE reservations_v1")


def to_baseline(conn: Connection) -> None:
    inspector = inspect(conn)
    if "clusters" in inspector.get_table_names() and "pool" not in {
            c["name"] for c in inspector.get_columns("clusters")}:
        conn.exec_driver_sql('ALTER TABLE clusters ADD COLUMN "pool" VARCHAR(64)')
    _rekey_reservations(conn)
    tables = [Base.metadata.tables[name] for name in BASELINE_TABLES]
    Base.metadata.create_all(conn, tables=tables)
    inspector = inspect(conn)
    for table in tables:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for col in table.columns:
            if col.name not in have and (table.name, col.name) not in AFTER_BASELINE:
                kind = col.type.compile(dialect=conn.dialect)
                conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}')
