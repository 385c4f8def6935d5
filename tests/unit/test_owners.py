"""Who frees what a `run` left when it died during start-up (lifecycle/owners.py)."""

from __future__ import annotations

import os

from gpufleet.lifecycle import owners
from gpufleet.lifecycle.owners import HeldCluster, Holder, StartingJob

RUN = Holder(100, 1.0)
SUP = Holder(200, 2.0)


def _job(creator: Holder | None = RUN, supervisor: Holder | None = None, live: bool = False,
         active: bool = True) -> StartingJob:
    return StartingJob(id=1, cluster_id=7, active=active, creator=creator, supervisor=supervisor,
                       supervisor_alive=live)


def test_a_dead_creator_without_a_supervisor_leaves_the_job_and_its_cluster_to_undo() -> None:
    out = owners.orphaned([_job()], [HeldCluster(7, RUN)], alive=lambda h: False)
    assert set(out.jobs) == {1} and "pid 100" in out.jobs[1]
    assert set(out.clusters) == {7} and "pid 100" in out.clusters[7]


def test_a_live_creator_keeps_everything() -> None:
    out = owners.orphaned([_job()], [HeldCluster(7, RUN)], alive=lambda h: True)
    assert out.jobs == {} and out.clusters == {}


def test_a_cluster_reserved_before_any_job_record_is_freed_when_its_owner_dies() -> None:
    out = owners.orphaned([], [HeldCluster(7, RUN)], alive=lambda h: h != RUN)
    assert set(out.clusters) == {7} and out.jobs == {}


def test_a_recorded_supervisor_is_judged_by_its_own_liveness() -> None:
    # the creator is gone but a supervisor was recorded: its own liveness decides, elsewhere
    out = owners.orphaned([_job(supervisor=SUP, live=True)], [HeldCluster(7, RUN)],
                          alive=lambda h: h == SUP)
    assert out.jobs == {}
    assert out.clusters == {}, "a live supervisor's cluster is never freed for its dead creator"


def test_records_from_before_creators_were_kept_are_left_alone() -> None:
    out = owners.orphaned([_job(creator=None)], [], alive=lambda h: False)
    assert out.jobs == {}


def test_an_ended_job_is_not_touched() -> None:
    assert owners.orphaned([_job(active=False)], [], alive=lambda h: False).jobs == {}


def test_alive_tells_a_reused_pid_from_the_process_recorded() -> None:
    me = owners.me()
    assert owners.alive(me)
    assert me.started is not None
    assert not owners.alive(Holder(os.getpid(), me.started - 3600))  # same pid, other process
    assert not owners.alive(Holder(2**22 + 12345, None))  # no such pid
