"""What Slurm's commands print, read into plain data: pure, so every rule here is tested against
captured output without a Slurm.

- `scontrol -o -d show node`: one line per node, `Key=Value` pairs (a value may hold spaces,
  as `Reason=Not responding [root@...]`), with `Gres=gpu:h100:8(S:0-1)` and the devices in use
  in `GresUsed=gpu:h100:2(IDX:0-1)`.
- `scontrol -o -d show job J`: one line; the per-node grant repeats `Nodes=n[1-2] CPU_IDs=...
  Mem=... GRES=gpu:h100:1(IDX:0)`, nodes with the same grant folded into one host list.
- `squeue -h -o ...`: the fields gpufleet asks for, separated by `|`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufleet import catalog
from gpufleet.errors import SpecError
from gpufleet.pool.model import FABRIC_LEVEL, Device, Node

SIMULATED_FEATURE = "gpufleet-simulated"  # a node whose GPUs are declared for tests
NETWORK_FEATURES = {"infiniband": "infiniband", "ib": "infiniband", "ethernet": "ethernet",
                    "roce": "ethernet"}
# Node state flags under which Slurm gives the node no new work: shown lost.
LOST_FLAGS = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING",
                        "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN",
                        "FUTURE", "INVAL", "UNKNOWN", "REBOOT_ISSUED"})

_PAIR = re.compile(r"(?:^|\s)([A-Za-z_/:]+)=(.*?)(?=\s[A-Za-z_/:]+=|$)")
_GRANT = re.compile(r"\sNodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")


def pairs(line: str) -> dict[str, str]:
    """`Key=Value ...` as a dict (the first of a repeated key wins)."""
    out: dict[str, str] = {}
    for key, value in _PAIR.findall(line.strip()):
        out.setdefault(key, value.strip())
    return out


def hostnames(hostlist: str) -> list[str]:
    """Slurm's folded host list (`n[1-3,7],gpu-a[01-02]`) unfolded, in order."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if m is None:
            out.append(part)
            continue
        head, ranges, tail = m.groups()
        for piece in ranges.split(","):
            lo, _, hi = piece.partition("-")
            if not hi:
                out.append(f"{head}{lo}{tail}")
                continue
            out.extend(f"{head}{str(i).zfill(len(lo))}{tail}" for i in range(int(lo), int(hi) + 1))
    return out


def indices(text: str) -> list[int]:
    """`0-2,5` as [0, 1, 2, 5]; `N/A` or empty as []."""
    out: list[int] = []
    for piece in text.split(","):
        lo, _, hi = piece.partition("-")
        if not lo.isdigit():
            continue
        out.extend(range(int(lo), int(hi) + 1) if hi.isdigit() else [int(lo)])
    return out


@dataclass(frozen=True)
class Gres:
    """One GPU entry of a node's GRES: `gpu:h100:8(S:0-1)` is type "h100", count 8."""

    type: str  # "" when the site names GPUs untyped (`gpu:8`)
    count: int
    used: tuple[int, ...] = ()  # the indices in use (from GresUsed)


def gpu_gres(text: str) -> list[Gres]:
    """The `gpu` entries of a `Gres=` or `GresUsed=` value (other GRES kinds are ignored)."""
    out = []
    for entry in re.split(r",(?=[a-z])", text):
        m = re.fullmatch(r"gpu(?::([^:(]+))?:(\d+)(?:\((.*)\))?", entry.strip())
        if m is None:
            continue
        kind, count, extra = m.group(1) or "", int(m.group(2)), m.group(3) or ""
        used = indices(extra[4:]) if extra.startswith("IDX:") else []
        out.append(Gres(kind, count, tuple(used)))
    return out


def state_flags(state: str) -> set[str]:
    """`IDLE+DRAIN`, `DOWN*`, `MIXED`: the flags, with `*` (not responding) as its own flag."""
    flags = {f.rstrip("*~#!%$@^-") for f in state.upper().split("+") if f}
    if "*" in state:
        flags.add("NOT_RESPONDING")
    return flags


def healthy_state(state: str) -> bool:
    return not (state_flags(state) & LOST_FLAGS)


def state_word(state: str) -> str:
    """What `pool list` says: idle, mixed, allocated, drained, down, ..."""
    flags = state_flags(state)
    for flag, word in (("DOWN", "down"), ("NOT_RESPONDING", "not responding"),
                       ("DRAINED", "drained"), ("DRAIN", "drained"), ("DRAINING", "draining"),
                       ("FAIL", "failed"), ("FAILING", "failing")):
        if flag in flags:
            return word
    base = state.split("+", 1)[0].rstrip("*~#!%$@^-").lower()
    return base or "unknown"


@dataclass(frozen=True)
class SlurmNode:
    """A node as Slurm describes it, and the pool node gpufleet makes of it."""

    node: Node
    gres_type: str  # what `--gres=gpu:TYPE:N` names its GPUs ("" untyped)
    feature_type: str  # the node feature that names the GPU type, when the GRES does not
    cpus: int
    memory_mb: int
    partitions: tuple[str, ...]
    features: tuple[str, ...] = ()


def _gpu_type(gres: list[Gres], features: list[str]) -> tuple[catalog.GpuType | None, str, str]:
    """The catalog type from the GRES type, else from a feature naming a type."""
    for g in gres:
        if g.type:
            try:
                return catalog.resolve_gpu(g.type), g.type, ""
            except SpecError:  # an unknown GRES type: try the features
                pass
    for f in features:
        try:
            return catalog.resolve_gpu(f), gres[0].type if gres else "", f
        except SpecError:  # most features are not GPU types
            continue
    return None, gres[0].type if gres else "", ""


def node_of(line: str) -> SlurmNode | None:
    """One line of `scontrol -o -d show node`; None for a line that is not a node."""
    f = pairs(line)
    name = f.get("NodeName")
    if not name:
        return None
    features = [x for x in re.split(r"[,&|]", f.get("AvailableFeatures", "")) if x and x != "(null)"]
    gres = gpu_gres(f.get("Gres", ""))
    used = {i for g in gpu_gres(f.get("GresUsed", "")) for i in g.used}
    state = f.get("State", "UNKNOWN")
    healthy = healthy_state(state)
    gtype, gres_type, feature_type = _gpu_type(gres, features)
    lowered = {x.lower() for x in features}
    simulated = SIMULATED_FEATURE in lowered
    fabric = next((x for x in lowered if x in FABRIC_LEVEL), "pcie")
    network = next((NETWORK_FEATURES[x] for x in lowered if x in NETWORK_FEATURES), "ethernet")
    count = sum(g.count for g in gres)
    type_name = gtype.name if gtype else f"unknown:{gres_type or 'gpu'}"
    mem = int(gtype.memory_gb * 1e9) if gtype else 0
    peers = range(count) if fabric != "pcie" else ()
    devices = tuple(
        Device(id=f"gpu{i}", index=i, gpu=type_name, memory_bytes=mem,
               healthy=healthy and gtype is not None, simulated=simulated, busy=i in used,
               nvlink_peers=tuple(p for p in peers if p != i))
        for i in range(count))
    node = Node(id=name, address=f.get("NodeAddr") or name, devices=devices, gpu_fabric=fabric,
                inter_fabric=network, free_disk_bytes=1 << 62, healthy=healthy, ref=name,
                state=state_word(state))
    cpus = int(f.get("CPUTot", "0") or 0) if f.get("CPUTot", "").isdigit() else 0
    memory = int(f["RealMemory"]) if f.get("RealMemory", "").isdigit() else 0
    parts = tuple(p for p in f.get("Partitions", "").split(",") if p)
    return SlurmNode(node, gres_type, feature_type, cpus, memory, parts, tuple(features))


def nodes_of(text: str, partition: str | None) -> list[SlurmNode]:
    """Every node of `partition` (None: every node) in `scontrol -o -d show node`'s output."""
    found = [n for n in map(node_of, text.splitlines()) if n is not None]
    return [n for n in found if partition is None or partition in n.partitions]


def default_partition(text: str) -> str | None:
    """The partition marked `Default=YES` in `scontrol -o show partition`."""
    for line in text.splitlines():
        f = pairs(line)
        if f.get("Default") == "YES" and f.get("PartitionName"):
            return f["PartitionName"]
    return None


def partitions(text: str) -> list[str]:
    return [f["PartitionName"] for f in map(pairs, text.splitlines()) if f.get("PartitionName")]


@dataclass(frozen=True)
class SlurmJob:
    """A job as `scontrol -o -d show job` shows it."""

    id: str
    name: str
    state: str  # PENDING, RUNNING, CANCELLED, NODE_FAIL, ...
    reason: str  # why it is pending ("Resources", "Priority"), "None" once running
    grants: tuple[tuple[str, tuple[int, ...]], ...]  # (node, GPU indices), in allocation order
    nodes: tuple[str, ...]

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def ended(self) -> bool:
        return self.state not in ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED",
                                  "REQUEUED", "REQUEUE_HOLD", "RESIZING")


def job_of(line: str) -> SlurmJob | None:
    f = pairs(line)
    if not f.get("JobId"):
        return None
    grants: list[tuple[str, tuple[int, ...]]] = []
    for hosts, gres in _GRANT.findall(" " + line):
        idx = tuple(i for g in gpu_gres(gres) for i in g.used)
        grants.extend((h, idx) for h in hostnames(hosts))
    listed = f.get("NodeList", "")
    nodes = tuple(hostnames(listed)) if listed and listed != "(null)" else ()
    return SlurmJob(f["JobId"], f.get("JobName", ""), f.get("JobState", "UNKNOWN"),
                    f.get("Reason", "None"), tuple(grants), nodes)


# Pending reasons that no amount of waiting clears: the request breaks the partition's own
# limits, or names what the site does not have. Anything else (Resources, Priority, QOS and
# association limits, a node that is down for now) can clear, so gpufleet waits and says why.
NEVER_CLEARS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit",
                          "BadConstraints", "InvalidAccount", "InvalidQOS",
                          "DependencyNeverSatisfied", "AccountNotAllowed", "QOSNotAllowed",
                          "PartitionDown", "PartitionInactive", "MaxGRESPerAccount"})
REASON_TEXT = {
    "Resources": "waiting for nodes to become free",
    "Priority": "other jobs of higher priority are ahead in Slurm's queue",
    "PartitionConfig": "the request breaks the partition's configuration (more nodes or "
                       "GPUs than it has, or a limit it sets)",
    "PartitionNodeLimit": "more nodes than the partition allows a job",
    "PartitionTimeLimit": "a time limit longer than the partition allows",
    "BadConstraints": "no node of the partition has the asked features",
}


def reason_text(reason: str) -> str:
    """Slurm's pending reason with what it means (`QOSMaxGRESPerUser` stays as Slurm says)."""
    key = reason.split(",", 1)[0]
    return f"{reason} ({REASON_TEXT[key]})" if key in REASON_TEXT else reason


def never_clears(reason: str) -> bool:
    return reason.split(",", 1)[0] in NEVER_CLEARS
