"""Reading Slurm's output (backends/slurm_parse.py): node lines, job lines, host lists."""

from __future__ import annotations

import pytest

from gpufleet.backends import slurm_parse as sp

# As `scontrol -o -d show node` prints them with Slurm 22.05 (double spaces included)
IDLE = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=0.18 "
        "AvailableFeatures=gpufleet-simulated ActiveFeatures=gpufleet-simulated Gres=gpu:h100:1 "
        "GresDrain=N/A GresUsed=gpu:h100:0(IDX:N/A) NodeAddr=127.0.0.1 NodeHostName=n1 Port=58583 "
        "Version=22.05.8 OS=Linux 6.18 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 "
        "FreeMem=23474 Sockets=4 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 "
        "Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2026-12-02T15:47:19 "
        "CfgTRES=cpu=4,mem=2000M,billing=4 AllocTRES= CapWatts=n/a ExtSensorsTemp=n/s")
BIG = ("NodeName=gpu-a07 CPUTot=96 AvailableFeatures=ib,nvswitch,h100 ActiveFeatures=ib "
       "Gres=gpu:8(S:0-1) GresUsed=gpu:8(IDX:0-2,5) NodeAddr=10.1.0.7 RealMemory=1000000 "
       "State=MIXED+DRAIN Partitions=batch,gpu Reason=bad fan [root@2026-12-01T10:00:00]")


def test_a_node_line_becomes_a_pool_node_with_its_gpus_state_and_features() -> None:
    n = sp.node_of(IDLE)
    assert n is not None
    node = n.node
    assert (node.id, node.address, node.state, node.healthy) == ("n1", "127.0.0.1", "idle", True)
    assert [(d.id, d.index, d.gpu, d.simulated, d.busy) for d in node.devices] == \
        [("gpu0", 0, "H100-SXM", True, False)]
    assert (node.gpu_fabric, node.inter_fabric) == ("pcie", "ethernet")
    assert (n.gres_type, n.feature_type, n.cpus, n.memory_mb, n.partitions) == \
        ("h100", "", 4, 2000, ("gpu",))


def test_untyped_gres_takes_its_type_from_a_feature_and_busy_indices_from_gresused() -> None:
    n = sp.node_of(BIG)
    assert n is not None
    assert (n.gres_type, n.feature_type) == ("", "h100")
    assert {d.gpu for d in n.node.devices} == {"H100-SXM"}
    assert [d.index for d in n.node.devices if d.busy] == [0, 1, 2, 5]
    assert (n.node.gpu_fabric, n.node.inter_fabric) == ("nvswitch", "infiniband")
    # drained: Slurm gives it no new work, so the pool shows it lost
    assert (n.node.state, n.node.healthy) == ("drained", False)
    assert not any(d.healthy for d in n.node.devices)
    assert sp.pairs(BIG)["Reason"] == "bad fan [root@2026-12-01T10:00:00]"


@pytest.mark.parametrize(("state", "word", "healthy"), [
    ("IDLE", "idle", True), ("MIXED", "mixed", True), ("ALLOCATED", "allocated", True),
    ("IDLE*", "not responding", False), ("DOWN*", "down", False),
    ("DOWN+NOT_RESPONDING", "down", False), ("IDLE+DRAIN", "drained", False),
    ("ALLOCATED+DRAIN", "drained", False), ("COMPLETING", "completing", True),
])
def test_node_states(state: str, word: str, healthy: bool) -> None:
    assert sp.state_word(state) == word
    assert sp.healthy_state(state) is healthy


def test_a_gpu_type_unknown_to_the_catalog_is_named_and_not_usable() -> None:
    n = sp.node_of(IDLE.replace("gpu:h100:1", "gpu:zz9:2").replace("gpufleet-simulated", "x"))
    assert n is not None
    assert [d.gpu for d in n.node.devices] == ["unknown:zz9"] * 2
    assert not any(d.healthy for d in n.node.devices)


def test_nodes_of_keeps_the_partitions_nodes_only() -> None:
    text = IDLE + "\n" + BIG + "\n" + IDLE.replace("n1", "n9").replace("Partitions=gpu", "Partitions=cpu")
    assert [n.node.id for n in sp.nodes_of(text, "gpu")] == ["n1", "gpu-a07"]
    assert [n.node.id for n in sp.nodes_of(text, None)] == ["n1", "gpu-a07", "n9"]


@pytest.mark.parametrize(("folded", "names"), [
    ("n1", ["n1"]), ("n[1-3]", ["n1", "n2", "n3"]), ("n[1,3]", ["n1", "n3"]),
    ("gpu-a[07-09,11],login1", ["gpu-a07", "gpu-a08", "gpu-a09", "gpu-a11", "login1"]),
    ("r[1-2]-x", ["r1-x", "r2-x"]),
])
def test_host_lists_unfold(folded: str, names: list[str]) -> None:
    assert sp.hostnames(folded) == names


JOB = ("JobId=7 JobName=gpufleet-big UserId=root(0) JobState=RUNNING Reason=None "
       "Dependency=(null) Requeue=0 Partition=gpu NodeList=n[1,3] BatchHost=n1 NumNodes=2 "
       "JOB_GRES=gpu:h100:2 Nodes=n[1,3] CPU_IDs=0-3 Mem=0 GRES=gpu:h100:1(IDX:0) "
       "MinCPUsNode=1 Comment=gpufleet cluster big for ana")


def test_a_running_job_line_gives_its_grant_node_by_node() -> None:
    job = sp.job_of(JOB)
    assert job is not None
    assert (job.id, job.name, job.state, job.running, job.ended) == \
        ("7", "gpufleet-big", "RUNNING", True, False)
    assert job.grants == (("n1", (0,)), ("n3", (0,)))
    assert job.nodes == ("n1", "n3")
    mixed = JOB.replace("Nodes=n[1,3] CPU_IDs=0-3 Mem=0 GRES=gpu:h100:1(IDX:0)",
                        "Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:h100:2(IDX:0-1) "
                        "Nodes=n3 CPU_IDs=0-3 Mem=0 GRES=gpu:h100:2(IDX:2,3)")
    assert sp.job_of(mixed).grants == (("n1", (0, 1)), ("n3", (2, 3)))  # type: ignore[union-attr]


def test_pending_and_ended_jobs() -> None:
    pending = sp.job_of("JobId=8 JobName=gpufleet-b JobState=PENDING Reason=Resources "
                        "NodeList=(null)")
    assert pending is not None
    assert (pending.running, pending.ended, pending.grants, pending.nodes) == (False, False, (), ())
    gone = sp.job_of("JobId=8 JobName=gpufleet-b JobState=NODE_FAIL Reason=NodeDown")
    assert gone is not None and gone.ended


def test_pending_reasons_that_never_clear_are_told_apart() -> None:
    assert sp.never_clears("PartitionConfig") and sp.never_clears("BadConstraints")
    for reason in ("Resources", "Priority", "QOSMaxGRESPerUser", "ReqNodeNotAvail, "
                   "UnavailableNodes:n2", "AssocGrpGRES"):
        assert not sp.never_clears(reason), reason
    assert sp.reason_text("Resources") == "Resources (waiting for nodes to become free)"
    assert sp.reason_text("QOSMaxGRESPerUser") == "QOSMaxGRESPerUser"


def test_partitions_and_the_default_one() -> None:
    text = ("PartitionName=debug AllowGroups=ALL Default=NO Nodes=n1\n"
            "PartitionName=gpu AllowGroups=ALL Default=YES Nodes=n[1-3]\n")
    assert sp.partitions(text) == ["debug", "gpu"]
    assert sp.default_partition(text) == "gpu"
    assert sp.default_partition(text.replace("YES", "NO")) is None
