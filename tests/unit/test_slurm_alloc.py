"""The Slurm command lines (backends/slurm_cmds.py) and the allocation's decisions
(lifecycle/engine_alloc.py) against an engine given as plain functions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.backends import alloc
from gpufleet.backends import slurm_cmds as cmds
from gpufleet.backends import slurm_parse as sp
from gpufleet.backends.slurm_run import lost_named
from gpufleet.errors import AllocationError
from gpufleet.lifecycle import engine_alloc
from gpufleet.pool.model import Device, Node


def test_sbatch_holds_whole_nodes_for_a_multi_node_cluster() -> None:
    ask = cmds.Ask(cluster="big", nodes=2, per_node=8, gres_type="h100", partition="gpu",
                   account="ml", time_limit_s=3601, exclude=("n2", "n5"), whole_nodes=True,
                   cpus_per_gpu=12, mem_per_gpu_mb=100_000, user="ana")
    argv = cmds.sbatch(ask)
    assert argv[:2] == ["sbatch", "--parsable"]
    for part in ("--job-name=gpufleet-big", "--comment=gpufleet cluster big for ana",
                 "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:h100:8", "--no-requeue",
                 "--partition=gpu", "--account=ml", "--time=61", "--exclude=n2,n5",
                 "--exclusive", "--mem=0"):
        assert part in argv, part
    assert not any(a.startswith(("--cpus-per-gpu", "--mem-per-gpu")) for a in argv)
    assert argv[-1] == "--wrap=exec sleep infinity"
    assert "=" not in ask.comment.split("cluster", 1)[1]  # a comment with no key=value in it


def test_sbatch_of_a_part_of_a_node_asks_cpus_and_memory_per_gpu() -> None:
    argv = cmds.sbatch(cmds.Ask(cluster="dev", nodes=1, per_node=2, feature="a100",
                                cpus_per_gpu=4, mem_per_gpu_mb=2000))
    assert "--gres=gpu:2" in argv and "--constraint=a100" in argv
    assert "--cpus-per-gpu=4" in argv and "--mem-per-gpu=2000M" in argv
    assert "--exclusive" not in argv and not any(a.startswith("--time") for a in argv)


def test_steps_share_the_allocation_and_a_run_steps_are_named() -> None:
    step = cmds.srun("12", "n3", ["python", "x.py"])
    assert step[:5] == ["srun", "--jobid=12", "--nodes=1", "--ntasks=1", "--nodelist=n3"]
    assert "--overlap" in step and f"--job-name={cmds.STEP_NAME}" in step
    assert step[-2:] == ["python", "x.py"]
    assert "--pty" in cmds.shell("12", "n3", ["/bin/bash"])
    assert "--pty" not in cmds.shell("12", "n3", ["printenv", "X"])


def test_time_limits_round_up_to_whole_minutes() -> None:
    assert [cmds.time_arg(s) for s in (1, 60, 61, 7200)] == ["1", "1", "2", "120"]


def test_srun_node_failure_lines_name_the_node() -> None:
    lines = ["srun: error: Node failure on n2", "srun: error: n1: task 0: Exited with exit code 1",
             "[rank0]: RuntimeError"]
    assert lost_named(lines) == {"n2"}
    assert lost_named(lines[1:]) == set()


def test_the_ask_names_the_gpus_as_the_partition_does_and_constrains_a_mixed_network() -> None:
    from gpufleet.backends.slurm import SlurmBackend

    def line(name: str, features: str, gres: str = "gpu:h100:8") -> str:
        return (f"NodeName={name} CPUTot=64 AvailableFeatures={features} Gres={gres} "
                f"NodeAddr={name} RealMemory=512000 State=IDLE Partitions=gpu")

    backend = SlurmBackend("s", "gpu")
    backend.seen = sp.nodes_of("\n".join([line("a1", "ib"), line("a2", "ib"),
                                          line("e1", "ethernet")]), "gpu")
    ask = backend.sbatch_ask(alloc.Ask("big", "H100-SXM", 16, 2, network="infiniband"))
    assert (ask.gres, ask.feature, ask.whole_nodes) == ("gpu:h100:8", "ib", True)
    one = backend.sbatch_ask(alloc.Ask("one", "H100-SXM", 2, 1))
    assert one.feature == ""
    assert (one.cpus_per_gpu, one.mem_per_gpu_mb, one.whole_nodes) == (8, 64000, False)
    backend.seen = sp.nodes_of(line("u1", "h100,ib", gres="gpu:8"), None)
    ib = alloc.Ask("u", "H100-SXM", 8, 1, network="infiniband")
    assert backend.sbatch_ask(ib).feature == "h100"
    assert "--constraint=h100" in cmds.sbatch(backend.sbatch_ask(alloc.Ask("u", "H100-SXM", 8, 1)))
    # spares: whole nodes more in the same allocation, which outlives a node's failure
    spared = backend.sbatch_ask(alloc.Ask("s", "H100-SXM", 2, 1, spares=2))
    argv = cmds.sbatch(spared)
    assert (spared.nodes, spared.whole_nodes, spared.no_kill) == (3, True, True)
    assert "--nodes=3" in argv and "--no-kill" in argv and "--gres=gpu:2" in argv
    assert "--no-kill" not in cmds.sbatch(backend.sbatch_ask(ib))


def test_slurm_job_states_read_as_pending_granted_or_ended() -> None:
    from gpufleet.backends.slurm import state_of

    assert state_of(None) == alloc.Ended("gone from Slurm's queue")
    assert state_of(_job("CANCELLED")) == alloc.Ended("CANCELLED")
    waiting = state_of(_job("PENDING", "Resources"))
    assert isinstance(waiting, alloc.Pending) and not waiting.never_clears
    assert waiting.reason == "Resources" and "waiting for nodes" in waiting.text
    never = state_of(_job("PENDING", "PartitionConfig"))
    assert isinstance(never, alloc.Pending) and never.never_clears
    assert state_of(_job("PENDING", "None")) == alloc.Pending("", "", False)
    assert state_of(_job("RUNNING")) == alloc.Pending("", "", False)  # no grants listed yet
    assert state_of(_job("RUNNING", grants=(("n1", (0,)),))) == alloc.Granted((("n1", (0,)),))


# -- the allocation -----------------------------------------------------------------------------

def _node(name: str, gpus: int = 1, healthy: bool = True, busy: tuple[int, ...] = ()) -> Node:
    return Node(id=name, address="10.0.0." + name[1:], healthy=healthy, inter_fabric="ethernet",
                devices=tuple(Device(id=f"gpu{i}", index=i, gpu="H100-SXM", memory_bytes=1,
                                     healthy=healthy, busy=i in busy) for i in range(gpus)))


def test_what_an_idle_partition_could_hold_is_submitted_whatever_is_busy_now() -> None:
    nodes = [_node("n1", busy=(0,)), _node("n2", healthy=False), _node("n3")]
    alloc = engine_alloc.refuse_impossible("H100-SXM", 3, 3, None, nodes, "partition gpu")
    assert len(alloc.placements) == 3
    with pytest.raises(AllocationError, match="partition gpu could never hold this"):
        engine_alloc.refuse_impossible("H100-SXM", 4, 4, None, nodes, "partition gpu")
    with pytest.raises(AllocationError, match="A100"):
        engine_alloc.refuse_impossible("A100-80GB", 1, 1, None, nodes, "partition gpu")


@dataclass
class Engine:
    """An allocating engine whose allocation's states come from a plain function (call number
    -> Slurm job, read as Slurm's backend reads it)."""

    states: Callable[[int], sp.SlurmJob | None]
    nodes: list[Node] = field(default_factory=lambda: [_node("n1", 2), _node("n2", 2)])
    cancelled: list[str] = field(default_factory=list)
    asked: list[alloc.Ask] = field(default_factory=list)
    calls: int = 0
    kind: str = "slurm"
    engine_name: str = "Slurm"
    alloc_word: str = "Slurm job"
    where: str = "partition gpu"

    def discover(self) -> list[Node]:
        return self.nodes

    def request(self, ask: alloc.Ask) -> tuple[str, str]:
        self.asked.append(ask)
        return "41", f"{ask.nodes} node(s) x {ask.per_node}"

    def state(self, ref: str) -> alloc.AllocState:
        from gpufleet.backends.slurm import state_of

        self.calls += 1
        return state_of(self.states(self.calls))

    def cancel(self, ref: str) -> None:
        self.cancelled.append(ref)

    def queued(self) -> list[alloc.Queued]:
        return []

    def dry_run(self, ask: alloc.Ask | None, ref: str, node_ids: list[str],
                job_dir: Path) -> list[str]:
        return []

    def shell(self, ref: str, node_id: str, argv: list[str],
              env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        return argv, env


def _job(state: str, reason: str = "None",
         grants: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> sp.SlurmJob:
    return sp.SlurmJob("41", "gpufleet-c", state, reason, grants, tuple(g[0] for g in grants))


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(engine_alloc.time, "sleep", lambda _s: None)
    yield


def test_a_grant_says_each_new_pending_reason_once_and_records_the_granted_gpus() -> None:
    seq = [_job("PENDING", "Priority"), _job("PENDING", "Priority"), _job("PENDING", "Resources"),
           _job("RUNNING", grants=(("n2", (1,)), ("n1", (0,))))]
    engine = Engine(lambda i: seq[min(i, len(seq)) - 1])
    said: list[str] = []
    got = engine_alloc.grant(engine, "c", "H100-SXM", 2, 2, None, None, said.append)
    pending = [s for s in said if "pending" in s]
    assert [s.split("pending: ")[1].split(" (")[0] for s in pending] == ["Priority", "Resources"]
    assert got.ref == "41" and engine.cancelled == []
    assert [(n.id, [d.index for d in n.devices]) for n in got.nodes] == [("n2", [1]), ("n1", [0])]
    assert engine.asked[0].nodes == 2 and engine.asked[0].per_node == 1


def test_a_reason_that_never_clears_is_refused_and_cancelled() -> None:
    engine = Engine(lambda _i: _job("PENDING", "PartitionConfig"))
    with pytest.raises(AllocationError, match="can never start: PartitionConfig"):
        engine_alloc.grant(engine, "c", "H100-SXM", 2, 2, None, None, lambda _t: None)
    assert engine.cancelled == ["41"]


def test_a_job_that_ends_before_it_starts_or_waits_too_long_is_cancelled() -> None:
    engine = Engine(lambda _i: _job("CANCELLED"))
    with pytest.raises(AllocationError, match="ended before it started"):
        engine_alloc.grant(engine, "c", "H100-SXM", 1, 1, None, None, lambda _t: None)
    ticks = iter(range(1000))
    waiting = Engine(lambda _i: _job("PENDING", "Resources"))
    with pytest.raises(AllocationError, match="still pending after 5 s"):
        engine_alloc.wait_running(waiting, "41", lambda _t: None,
                                  clock=lambda: float(next(ticks)), deadline_s=5)
    assert engine.cancelled == ["41"] and waiting.cancelled == ["41"]


def test_an_interrupted_wait_cancels_the_request() -> None:
    def states(i: int) -> sp.SlurmJob:
        if i == 3:
            raise KeyboardInterrupt
        return _job("PENDING", "Resources")

    engine = Engine(states)
    with pytest.raises(KeyboardInterrupt):
        engine_alloc.grant(engine, "c", "H100-SXM", 1, 1, None, None, lambda _t: None)
    assert engine.cancelled == ["41"]


def test_excluded_nodes_are_asked_for_and_a_shape_they_leave_impossible_is_refused() -> None:
    engine = Engine(lambda _i: _job("RUNNING", grants=(("n1", (0, 1)),)))
    got = engine_alloc.grant(engine, "c", "H100-SXM", 2, 1, None, None, lambda _t: None,
                             exclude=("n2",))
    assert engine.asked[0].exclude == ("n2",) and got.nodes[0].id == "n1"
    with pytest.raises(AllocationError, match="could never hold"):
        engine_alloc.grant(engine, "c", "H100-SXM", 4, 2, None, None, lambda _t: None,
                           exclude=("n2",))
    assert len(engine.asked) == 1  # the impossible one was never submitted
