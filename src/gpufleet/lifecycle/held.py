"""Which team holds which devices: what a team's quota counts.

A running cluster counts for a team when a job of the team runs on it, or when a member of the
team launched it (through a server, `clusters.user`), idle or not, so launching clusters is no
way around a quota. Each cluster counts once, with all its devices.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.status import CLUSTER_ACTIVE, JOB_ACTIVE
from gpufleet.store import Cluster, Job, User


def by_team(s: Session, exclude: int | None = None) -> dict[tuple[str, str], int]:
    """(team, GPU type) -> devices held, in the caller's transaction; `exclude`: a cluster id
    not to count (the one a job is being recorded on)."""
    member = {name: team for name, team in s.execute(select(User.name, User.team))
              if team is not None}
    running = {cid: team for cid, team in s.execute(
        select(Job.cluster_id, Job.team).where(Job.status.in_(JOB_ACTIVE),
                                               Job.team.is_not(None)))}
    out: dict[tuple[str, str], int] = {}
    for cid, gpu, count, user in s.execute(
            select(Cluster.id, Cluster.gpu, Cluster.count, Cluster.user)
            .where(Cluster.status.in_(CLUSTER_ACTIVE))):
        if cid == exclude:
            continue
        teams = {t for t in (running.get(cid), member.get(user or "")) if t is not None}
        for team in teams:
            out[(team, gpu)] = out.get((team, gpu), 0) + count
    return out
