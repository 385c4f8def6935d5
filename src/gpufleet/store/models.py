"""SQLAlchemy 2 tables. Times are UNIX seconds (float); money is USD; sizes are bytes.

The same tables on SQLite and PostgreSQL (store/postgres.py). String lengths are documentation:
SQLite never enforced them and the code was written so, and PostgreSQL is not made to either.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# A 64-bit integer on both backends: PostgreSQL's INTEGER is 32 bits (a 100 GB disk, or ids after
# two billion metric rows, would not fit), SQLite's already 64, and an SQLite primary key must be
# spelled INTEGER to be the rowid, so the SQLite schema stays as it was.
Int64 = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Cluster(Base):
    __tablename__ = "clusters"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    # unique among running clusters (checked in the launch transaction); history keeps old names
    name: Mapped[str] = mapped_column(String(64), index=True)
    gpu: Mapped[str] = mapped_column(String(32))
    count: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[int] = mapped_column(Integer)
    network: Mapped[str] = mapped_column(String(16))
    disk_bytes: Mapped[int] = mapped_column(Int64)
    backend: Mapped[str] = mapped_column(String(16))
    price_book: Mapped[str | None] = mapped_column(String(32), nullable=True)
    usd_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    # pending -> running -> stopping -> stopped (or failed)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stopped_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    scratch_dir: Mapped[str] = mapped_column(Text)
    spec_json: Mapped[str] = mapped_column(Text)
    for_job: Mapped[str | None] = mapped_column(String(64), nullable=True)  # made by `run`
    # An elastic job's cluster changes size: the cost at the old rates is banked, and the
    # current rate runs from rate_since (None: one rate since started_at).
    banked_usd: Mapped[float | None] = mapped_column(Float, nullable=True, default=0.0)
    rate_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    pool: Mapped[str | None] = mapped_column(String(64), nullable=True)  # None: this host
    # devices a pool declared for tests and planning: never billed (usd_per_hour stays 0)
    simulated: Mapped[bool | None] = mapped_column(Boolean, nullable=True, default=False)
    # the process still setting up a cluster made for a job (lifecycle/owners.py); cleared when
    # the job's supervisor is recorded, so a `run` killed during start-up frees what it reserved
    owner_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    owner_started: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the server's user who launched it (POST /api/v1/clusters) or whose job it was made for;
    # None: launched without a server, which only an admin may stop through one
    user: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # the engine's own allocation for the cluster (a Slurm job id), released on stop
    engine_ref: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # stopped, and every second of it booked in the ledger: `ledger.accrue` looks no more
    settled: Mapped[bool | None] = mapped_column(Boolean, nullable=True, default=False)
    # whole spare nodes held now beside `nodes` (`--spares`; lifecycle/spares.py): billed too
    spares: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    @property
    def billed_devices(self) -> int:
        """The devices its rate is for: its own and its spare nodes' (what the ledger books)."""
        return self.count + (self.spares or 0) * (self.count // max(1, self.nodes))


class Pool(Base):
    """A source of nodes besides this host: a Ray cluster (added, or started here by `pool up
    --local`) or a synthetic pool. The default pool is where `launch` and `run` carve clusters."""

    __tablename__ = "pools"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # ray | sim | slurm
    address: Mapped[str | None] = mapped_column(String(128), nullable=True)  # ray: HOST:PORT
    spec_json: Mapped[str] = mapped_column(Text, default="{}")  # sim shapes; Ray, Slurm settings
    created_at: Mapped[float] = mapped_column(Float)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    managed: Mapped[bool] = mapped_column(Boolean, default=False)  # started by `pool up --local`


class Reservation(Base):
    """A device held by a cluster. The unique key is what stops two launches sharing a device;
    node names repeat across pools (every local Ray pool has a 'head'), so the pool is in it."""

    __tablename__ = "reservations"
    __table_args__ = (UniqueConstraint("pool", "node_id", "device_id"),)

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    pool: Mapped[str] = mapped_column(String(64), default="local", server_default="local")
    node_id: Mapped[str] = mapped_column(String(64))
    address: Mapped[str] = mapped_column(String(64))
    device_id: Mapped[str] = mapped_column(String(32))
    device_index: Mapped[int] = mapped_column(Integer)
    # a whole node held beside the cluster's own (`--spares`): not placed on, but held, billed
    # and warmed; a heal makes it one of the cluster's (lifecycle/spares.py)
    spare: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"))
    # starting -> running -> succeeded | failed | stopped | interrupted
    status: Mapped[str] = mapped_column(String(16))
    spec_json: Mapped[str] = mapped_column(Text)
    job_dir: Mapped[str] = mapped_column(Text)
    world_size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    supervisor_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    supervisor_started: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the process that created (or reopened) the record, until a supervisor is recorded
    creator_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    creator_started: Mapped[float | None] = mapped_column(Float, nullable=True)
    # progress as last reported by rank 0
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    total_steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    samples: Mapped[int] = mapped_column(Int64, default=0)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_step: Mapped[int | None] = mapped_column(Integer, nullable=True)  # first step reported
    first_step_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_report_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # "applied" (the script called gpufleet.train.prepare) or "own:KIND" (it ran as written;
    # KIND what it built itself), from the bootstrap's note at the first step: see layout_use
    layout_seen: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # who submitted it (a server's user; the OS user for a job started without one) and their
    # team then: what usage and the ledger bill it to
    user: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # what it cost, in micro-dollars (plan/billing.py): its ended runs, and the meter of its
    # cluster when its open run began (None: no run open); kept with its `JobRun`s
    billed_micro_usd: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    run_from_micro_usd: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class JobRun(Base):
    """One stretch of a job on a cluster (from its start or resume to its end, or to the stop of
    a cluster made for it), with the cluster's cost meter read in micro-dollars at both ends
    (plan/billing.py): what the ledger splits a cluster's cost by."""

    __tablename__ = "job_runs"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), index=True)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: running
    from_micro_usd: Mapped[int] = mapped_column(BigInteger)
    to_micro_usd: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Event(Base):
    """One lifecycle transition of a job, with when and why."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")


class Metric(Base):
    """One sample in the shared schema (telemetry/schema.py): (time, cluster, job, node, rank,
    device, name, value). Device samples have rank -1 and a device; job samples neither."""

    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_job_name_time", "job", "name", "time"),)

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    time: Mapped[float] = mapped_column(Float)
    cluster: Mapped[str] = mapped_column(String(64))
    job: Mapped[str] = mapped_column(String(64))
    node: Mapped[str] = mapped_column(String(64))
    rank: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # seconds each row stands for: None for a raw sample, else the bucket of a downsampled mean
    resolution: Mapped[float | None] = mapped_column(Float, nullable=True)


class Diagnosis(Base):
    """A diagnosis about a job (telemetry/diagnose.py), kept while it holds and after."""

    __tablename__ = "findings"
    __table_args__ = (UniqueConstraint("job_id", "key"),)

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    key: Mapped[str] = mapped_column(String(96))  # rule:subject
    rule: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(16))
    subject: Mapped[str] = mapped_column(String(64), default="")
    title: Mapped[str] = mapped_column(Text)
    detail: Mapped[str] = mapped_column(Text)
    fix: Mapped[str] = mapped_column(Text)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    active: Mapped[bool] = mapped_column(Boolean, default=True)


class User(Base):
    """Someone who may call a server. The token is kept as its SHA-256 only."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class Team(Base):
    """A group of users sharing quotas (`Quota`) and a budget (`Budget`)."""

    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)


class Budget(Base):
    """A team's budget in USD for one calendar month (UTC, "2026-12"), or for every month
    without its own row ("*")."""

    __tablename__ = "budgets"
    __table_args__ = (UniqueConstraint("team", "month"),)

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    team: Mapped[str] = mapped_column(String(64))
    month: Mapped[str] = mapped_column(String(7))
    usd: Mapped[float] = mapped_column(Float)


class Quota(Base):
    """At most `devices` of one GPU type held by a team's jobs at once."""

    __tablename__ = "quotas"
    __table_args__ = (UniqueConstraint("team", "gpu"),)

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    team: Mapped[str] = mapped_column(String(64))
    gpu: Mapped[str] = mapped_column(String(32))
    devices: Mapped[int] = mapped_column(Integer)


class QueuedJob(Base):
    """A job waiting for its turn (lifecycle/queued.py); kept after it started or was
    cancelled, as the queue's history. Its job record is made when it starts."""

    __tablename__ = "queue"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    user: Mapped[str] = mapped_column(String(64), index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[float] = mapped_column(Float)
    spec_json: Mapped[str] = mapped_column(Text)
    cpu_slots: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the submitting shell's environment (a local `run`), which its supervisor gets as a `run`
    # that starts at once would have given it; None: the server's own (a job sent to a server)
    env_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    # what it waits for, fixed at submission: devices of a type on a pool (or a whole existing
    # cluster), the rate it will be billed, its time limit
    pool: Mapped[str] = mapped_column(String(64), default="local")
    gpu: Mapped[str] = mapped_column(String(32))
    count: Mapped[int] = mapped_column(Integer)
    cluster: Mapped[str | None] = mapped_column(String(64), nullable=True)
    usd_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # queued -> started | cancelled | refused (it could not start when its turn came)
    status: Mapped[str] = mapped_column(String(16), index=True)
    wait: Mapped[str | None] = mapped_column(String(16), nullable=True)  # sched.model.Wait
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    est_start: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the last pass that changed its place, wait or reason
    decided_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    left_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # started or cancelled
    # a job that must succeed before this one starts (--after); who held it (gpufleet hold),
    # None while it is not held; why est_start is None, in words (sched.model.Held.unknown)
    after: Mapped[str | None] = mapped_column(String(64), nullable=True)
    held_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    start_note: Mapped[str | None] = mapped_column(Text, nullable=True)


class AuditEvent(Base):
    """Who did what: submit, cancel, stop, a user added, a quota or budget changed."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    user: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(96), default="")
    detail: Mapped[str] = mapped_column(Text, default="")


class LedgerRow(Base):
    """Money a cluster accrued at one rate, from `start` to `end`, for a job running on it or,
    without a job, for its owner while it was reserved idle (lifecycle/ledger.py). Amounts
    are whole micro-dollars, so any sum of rows is exact."""

    __tablename__ = "ledger"

    id: Mapped[int] = mapped_column(Int64, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), nullable=True, index=True)
    job: Mapped[str | None] = mapped_column(String(64), nullable=True)  # None: idle time
    # None only in rows booked before clusters had rows of their own (revision 0005)
    cluster_id: Mapped[int | None] = mapped_column(ForeignKey("clusters.id"), nullable=True,
                                                   index=True)
    cluster: Mapped[str | None] = mapped_column(String(64), nullable=True)
    user: Mapped[str] = mapped_column(String(64), index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpu: Mapped[str] = mapped_column(String(32))
    devices: Mapped[int] = mapped_column(Integer)
    price_book: Mapped[str | None] = mapped_column(String(32), nullable=True)
    usd_per_hour: Mapped[float] = mapped_column(Float)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float] = mapped_column(Float, index=True)
    micro_usd: Mapped[int] = mapped_column(BigInteger)
    open: Mapped[bool] = mapped_column(Boolean, default=True)  # still accruing
