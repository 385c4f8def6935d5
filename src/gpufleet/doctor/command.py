"""`gpufleet doctor [--cluster NAME] [--image IMAGE ...] [--json]`: check a node before paying
for a job on it.

Per node: pick what to check (a cluster's reserved devices, or this host's GPUs, else 2 CPU
workers), gather the facts, judge them, print. Doctor reserves nothing and writes nothing to the
store; the all-reduce's processes are gone when it returns. With `--image` it checks that image
on this host instead (`doctor/image_checks.py`): the runtime, the image, its Python, torch,
CUDA and /dev/shm, through one short run of it.

`python -m gpufleet.doctor.command` runs the same command without the Typer CLI.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpufleet.doctor import checks
from gpufleet.doctor.model import Check, Target
from gpufleet.errors import ConflictError, GpufleetError, SpecError, excerpt
from gpufleet.launch.container import Container, opt_problems
from gpufleet.pool.model import Device, Node
from gpufleet.vocab import PULLS, Pull, spoken

if TYPE_CHECKING:
    from gpufleet.backends.base import Reaches

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}
MATRIX_LEGEND = ("NV#: # NVLinks. PCIe path: PIX one bridge, PXB several bridges, PHB the CPU's "
                 "host bridge, NODE host bridges in a NUMA node, SYS across CPU sockets "
                 "(as in `nvidia-smi topo -m`)")
DEFAULT_CPU_WORKERS = 2  # without --cluster on a host with no GPU: the smallest real all-reduce


@dataclass(frozen=True)
class NodeReport:
    node: str
    cluster: str | None
    checks: list[Check]

    def to_dict(self) -> dict[str, object]:
        return {"node": self.node, "cluster": self.cluster,
                "checks": [c.to_dict() for c in self.checks]}


def default_target(node: Node) -> Target:
    """Without --cluster: every GPU the node has, else two CPU workers."""
    gpus = tuple(d for d in node.devices if d.gpu != "cpu")
    if gpus:
        return Target(node.id, None, gpus[0].gpu, node.gpu_fabric, gpus)
    slots = tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=0)
                  for i in range(DEFAULT_CPU_WORKERS))
    return Target(node.id, None, "cpu", "pcie", slots)


def cluster_targets(name: str) -> list[Target]:
    """The cluster's reserved devices, one target per node; a stopped cluster is refused."""
    from gpufleet.lifecycle import clusters
    from gpufleet.store import Store

    store = Store()
    cluster = clusters.get(store, name)
    if cluster.status not in clusters.ACTIVE:
        raise ConflictError(f"cluster: '{name}' is {cluster.status}; launch it again to check it")
    return [Target(p.node_id, cluster.name, cluster.gpu, cluster.network, p.devices)
            for p in clusters.placements(store, cluster)]


def cluster_engine(name: str) -> object | None:
    """The backend of the cluster's pool (None: this host's)."""
    from gpufleet.lifecycle import clusters, pools
    from gpufleet.store import Store

    store = Store()
    pool = pools.pool_of(store, clusters.get(store, name))
    return pools.backend_for(pool) if pool is not None else None


def reach_reports(targets: list[Target], engine: Reaches) -> dict[str, list[Check]]:
    """Each node's reach checks: every other node of the cluster and the submitter's report
    address (a port opened here for the check, closed after)."""
    import socket

    from gpufleet.doctor import reach

    found: dict[str, list[Check]] = {}
    host = engine.report_host()
    with socket.create_server((host, 0)) as listener:  # the kernel accepts; nothing is read
        port = listener.getsockname()[1]
        names = {(host, port): "the submitter's report address"}
        for target in targets:
            peers = [t.node for t in targets if t.node != target.node]
            try:
                results = engine.reach(target.node, peers, [(host, port)])
            except ConnectionError as exc:
                found[target.node] = [reach.unasked(target.node, str(exc))]
                continue
            for r in results:
                names.setdefault((r.address, r.port), f"node {r.address}'s sshd")
            found[target.node] = reach.reach_checks(target.node, results, names)
    return found


def check_nodes(targets: list[Target] | None, node: Node,
                engine: object | None = None) -> list[NodeReport]:
    """Gather and judge each target's node. The device checks probe this host only; a node of
    another machine gets, where its engine can ask it (`backends.base.Reaches`), whether it
    reaches the other nodes and the submitter."""
    from gpufleet.backends.base import Reaches
    from gpufleet.doctor import facts

    nvml = facts.nvml_facts()
    reports = []
    reached = reach_reports(targets, engine) if targets and isinstance(engine, Reaches) else {}
    for target in targets if targets is not None else [default_target(node)]:
        if target.node != node.id:
            reports.append(NodeReport(target.node, target.cluster, [Check(
                "node", "warn", f"devices not checked: doctor probes this host ({node.id}) "
                "only", f"run `gpufleet doctor` on {target.node}"),
                *reached.get(target.node, [])]))
            continue
        reports.append(NodeReport(target.node, target.cluster,
                                  checks.run_all(facts.gather(target, node, nvml))))
    return reports


def _report_table(r: NodeReport) -> Table:
    title = f"Node {r.node}" + (f", cluster {r.cluster}" if r.cluster else "")
    t = Table(title=title, title_justify="left")
    t.add_column("CHECK", no_wrap=True)
    t.add_column("STATUS", no_wrap=True)
    t.add_column("DETAIL")
    t.add_column("FIX")
    for c in r.checks:
        t.add_row(c.name, Text(c.status.upper(), style=STYLE[c.status]), c.detail, c.fix or "-")
    return t


def _matrix_table(c: Check) -> Table:
    """The GPU link matrix, laid out like `nvidia-smi topo -m`."""
    gpus = list(c.data["gpus"])
    t = Table(title="GPU topology", title_justify="left")
    t.add_column("")
    for g in gpus:
        t.add_column(g, justify="center")
    for g, row in zip(gpus, c.data["matrix"], strict=True):
        t.add_row(g, *row)
    return t


def render(reports: list[NodeReport], console: Console) -> None:
    for r in reports:
        console.print(_report_table(r))
        for c in r.checks:
            if c.name == "topology" and "matrix" in c.data:
                console.print(_matrix_table(c))
                console.print(MATRIX_LEGEND, highlight=False)
    counts = checks.summary([c for r in reports for c in r.checks])
    style = "bold red" if counts["failed"] else "yellow" if counts["warnings"] else "green"
    console.print(Text(checks.summary_line(counts), style=style))


def image_reports(container: Container, targets: list[Target] | None,
                  node: Node) -> list[NodeReport]:
    """The image's checks on this host; another node of the cluster is said, not checked (its
    own preflight checks it before its workers start)."""
    from gpufleet.backends.image_preflight import checks as image_checks

    reports = []
    for target in targets if targets is not None else [default_target(node)]:
        if target.node != node.id:
            reports.append(NodeReport(target.node, target.cluster, [Check(
                "image", "warn", f"not checked: doctor --image probes this host ({node.id}) only",
                f"run `gpufleet doctor --image {container.image}` on {target.node}")]))
            continue
        reports.append(NodeReport(target.node, target.cluster,
                                  image_checks(container, target.node)[1]))
    return reports


def container_of(image: str, pull: str = "missing", shm_size: str | None = None,
                 opts: tuple[str, ...] = ()) -> Container:
    """doctor's flags as the job's ask; a bad value is a SpecError naming the flag."""
    problems = []
    if pull not in PULLS:
        problems.append(("pull", f"must be one of: {spoken(PULLS)}; got {excerpt(pull)}"))
    if shm_size is not None and not re.fullmatch(r"[0-9]+[bkmgBKMG]?", shm_size):
        problems.append(("shm_size", f"a size such as 8g (a number with b, k, m or g); got "
                         f"{excerpt(shm_size)}"))
    problems.extend(opt_problems(opts))  # what gpufleet sets itself is refused, as for a job
    if not image.strip():
        problems.append(("image", "an image name, e.g. nvcr.io/nvidia/pytorch:24.06-py3"))
    if problems:
        raise SpecError(problems)
    return Container(image=image, pull=cast(Pull, pull), shm_size=shm_size, opts=opts)


def doctor(cluster: str | None, as_json: bool, console: Console,
           container: Container | None = None) -> int:
    """Check the cluster's node(s), or this host; print a table or JSON on `console`.

    Returns the exit code: 1 when any check fails, else 0. An unknown cluster raises
    NotFoundError and a stopped one ConflictError (the CLI prints them and exits 2).
    """
    from gpufleet.backends.local import LocalBackend

    targets = cluster_targets(cluster) if cluster is not None else None
    engine = cluster_engine(cluster) if cluster is not None else None
    # No state_dir: an unusable $GPUFLEET_HOME is the disk check's finding, not an error here.
    [node] = LocalBackend().discover()
    if container is not None:
        reports = image_reports(container, targets, node)
    elif as_json or not console.is_terminal:
        reports = check_nodes(targets, node, engine)
    else:
        with console.status("Checking (the all-reduce takes a few seconds)..."):
            reports = check_nodes(targets, node, engine)
    every = [c for r in reports for c in r.checks]
    counts = checks.summary(every)
    if as_json:
        doc = {"nodes": [r.to_dict() for r in reports], "summary": counts,
               "ok": counts["failed"] == 0}
        console.out(json.dumps(doc, indent=2), highlight=False)
    else:
        render(reports, console)
    return 1 if counts["failed"] else 0


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet doctor", description=(
        "Check devices, driver and library versions, BF16, topology, NCCL settings, /dev/shm, "
        "open-file limit, disk and a real all-reduce."))
    parser.add_argument("--cluster", help="check this cluster's devices (default: this host)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--image", help="check this image on this host instead")
    parser.add_argument("--pull", default="missing", help="never, missing or always")
    parser.add_argument("--shm-size", help="the job's --shm-size (default: host IPC)")
    parser.add_argument("--container-opt", action="append", default=[],
                        help="an extra runtime option the job passes (repeatable)")
    opts = parser.parse_args(args)
    out = Console(width=None if Console().is_terminal else 160)
    try:
        container = (container_of(opts.image, opts.pull, opts.shm_size,
                                  tuple(opts.container_opt)) if opts.image is not None else None)
        return doctor(opts.cluster, opts.json, out, container)
    except GpufleetError as e:
        err = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 160)
        err.print(Text.assemble(("error: ", "bold red"), str(e)), highlight=False, soft_wrap=True)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
