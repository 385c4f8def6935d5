"""Every cluster that could train a workload (GPU type x count x network x layout), planned,
filtered by a deadline and/or a budget, and ranked; the rest grouped by why they fall out.

Pure: the catalog is the search space. Fast enough to run on every keystroke of a CLI
(a few thousand plans in well under a second; bench in docs/planning.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpufleet import catalog
from gpufleet.catalog import GpuType
from gpufleet.parallelism import Layout, LayoutError, model_problems, precision_problem, resolve
from gpufleet.plan.calibration import Calibration
from gpufleet.plan.estimate import INTER_NODE, Plan, Workload, cluster_problems, estimate
from gpufleet.plan.models import gib

COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
DP_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
PP_MICROBATCHES_PER_STAGE = 4  # m = 4p keeps the 1F1B bubble near (p-1)/(5p-1), under 20%


@dataclass(frozen=True)
class Rejected:
    gpu: str
    count: int
    network: str
    layout: str
    kind: str  # "precision", "cluster", "layout", "memory", "deadline", "budget", "price"
    reason: str
    need: float  # how far off: GiB needed, hours taken or dollars spent (for the closest miss)


@dataclass(frozen=True)
class Ranking:
    ranked: list[Plan]
    rejected: list[Rejected]
    considered: int
    by: str  # "cost" or "time"


def short_layout(layout: Layout) -> str:
    """'fsdp dp4 tp8 pp2': the data-parallel method and the mesh dimensions above 1."""
    dims = [f"{k}{v}" for k, v in (("dp", layout.dp), ("tp", layout.tp), ("pp", layout.pp)) if v > 1]
    return " ".join([layout.data_parallel if layout.dp > 1 or not dims else "", *dims]).strip()


def networks_for(gpu: GpuType, count: int) -> list[str]:
    """Fabrics worth comparing: inside one node PCIe and the type's own fabric; across nodes
    every network fabric."""
    if count > int(catalog.planner_defaults()["gpus_per_node"]):
        return list(INTER_NODE)
    fabrics = catalog.interconnects()
    options = ["pcie"]
    if gpu.node_fabric != "pcie" and count > 1 and count <= fabrics[gpu.node_fabric].max_gpus:
        options.append(gpu.node_fabric)
    return options


def layouts_for(count: int, workload: Workload, strategies: Sequence[str] | None) -> Iterator[Layout]:
    """Data parallelism alone; FSDP with tensor parallelism inside a node; and, for the models
    that need it, 3D: tensor parallelism over a node, pipeline stages across, FSDP over the rest."""
    w, model = workload, workload.model
    per_node = int(catalog.planner_defaults()["gpus_per_node"])
    tried: set[tuple[str, int, int, int]] = set()

    def make(strategy: str, **dims: int) -> Layout | None:
        microbatches = None
        if dims.get("pp", 1) > 1:
            microbatches = PP_MICROBATCHES_PER_STAGE * dims["pp"]
        try:
            layout = resolve(strategy, count, precision=w.precision, framework=w.framework,
                             microbatches=microbatches, **dims)  # type: ignore[arg-type]
        except LayoutError:
            return None
        # with one data-parallel rank the method changes nothing: keep the first (DDP)
        key = (layout.data_parallel if layout.dp > 1 else "", layout.dp, layout.tp, layout.pp)
        if key in tried or model_problems(layout, model.layers, model.heads):
            return None
        tried.add(key)
        return layout

    wanted = strategies or (*DP_STRATEGIES, "tp", "pp")
    for s in wanted:
        if s in ("ddp", "zero1", "zero2", "zero3", "fsdp") and (layout := make(s)) is not None:
            yield layout
    tps = [t for t in (2, 4, 8) if t <= min(count, per_node) and count % t == 0]
    if "tp" in wanted:
        for t in tps:
            if (layout := make("fsdp", tp=t)) is not None:
                yield layout
    if "pp" in wanted:
        t = min(per_node, count)
        p = 2
        while t * p <= count:
            if count % (t * p) == 0 and (layout := make("fsdp", tp=t, pp=p)) is not None:
                yield layout
            p *= 2


def candidates(workload: Workload, gpus: Sequence[GpuType] | None = None,
               counts: Sequence[int] | None = None, networks: Sequence[str] | None = None,
               strategies: Sequence[str] | None = None,
               ) -> Iterator[tuple[GpuType, int, str, Layout | Rejected]]:
    """Every cluster and layout to plan, or, where a whole GPU type, cluster shape or count has
    nothing to plan, a Rejected saying why (so a ranking never ends with no reason)."""
    types = gpus or [g for g in catalog.gpu_types().values() if not g.is_cpu]
    for gpu in types:
        why = precision_problem(workload.precision, gpu.name, gpu.bf16, gpu.fp16_tflops > 0)
        if why:
            yield gpu, 0, "", Rejected(gpu.name, 0, "", "", "precision", why, 0.0)
            continue
        for count in counts or COUNTS:
            for network in networks or networks_for(gpu, count):
                problems = cluster_problems(gpu, count, network)
                if problems:
                    reason = "; ".join(f"{f}: {m}" for f, m in problems)
                    yield gpu, count, network, Rejected(gpu.name, count, network, "", "cluster", reason, 0.0)
                    continue
                found = False
                for layout in layouts_for(count, workload, strategies):
                    found = True
                    yield gpu, count, network, layout
                if not found:
                    asked = ", ".join(strategies) if strategies else "any strategy"
                    reason = (f"no layout of {asked} on {count} GPUs suits the model's "
                              f"{workload.model.layers} layers and {workload.model.heads} heads")
                    yield gpu, count, network, Rejected(gpu.name, count, network, "", "layout", reason, 0.0)


def rank(workload: Workload, *, deadline_h: float | None = None, budget_usd: float | None = None,
         gpus: Sequence[GpuType] | None = None, counts: Sequence[int] | None = None,
         networks: Sequence[str] | None = None, strategies: Sequence[str] | None = None,
         calibration: Calibration | None = None) -> Ranking:
    """Plans that fit in memory and meet the deadline and budget: cheapest first when a deadline
    is given, else fastest first (a budget alone asks "how fast can I go for this much")."""
    by = "cost" if deadline_h is not None or budget_usd is None else "time"
    ranked: list[Plan] = []
    rejected: list[Rejected] = []
    considered = 0
    for gpu, count, network, item in candidates(workload, gpus, counts, networks, strategies):
        if isinstance(item, Rejected):
            rejected.append(item)
            continue
        considered += 1
        plan = estimate(workload, gpu, count, network, item, calibration)
        label = short_layout(item)

        def reject(kind: str, reason: str, need: float, g: str = gpu.name, c: int = count,
                   n: str = network, lab: str = label) -> None:
            rejected.append(Rejected(g, c, n, lab, kind, reason, need))

        if plan.fits is False:
            reject("memory", f"needs {gib(plan.total):.2f} GiB per GPU of "
                   f"{gib(plan.capacity or 0):.2f} usable", gib(plan.total))
            continue
        hours = plan.wall_time_h
        if deadline_h is not None and hours is not None and hours > deadline_h:
            reject("deadline", f"takes {hours:.1f} h, over the {deadline_h:g} h deadline", hours)
            continue
        cheapest = plan.cheapest_usd
        if budget_usd is not None or by == "cost":
            if cheapest is None:
                reject("price", f"no price book offers {gpu.name}", 0.0)
                continue
            if budget_usd is not None and cheapest > budget_usd:
                reject("budget", f"costs ${cheapest:,.2f}, over the ${budget_usd:,.2f} budget", cheapest)
                continue
        ranked.append(plan)
    inf = float("inf")
    if by == "cost":
        ranked.sort(key=lambda p: (p.cheapest_usd if p.cheapest_usd is not None else inf,
                                   p.wall_time_h or inf))
    else:
        ranked.sort(key=lambda p: (p.wall_time_h or inf,
                                   p.cheapest_usd if p.cheapest_usd is not None else inf))
    return Ranking(ranked=ranked, rejected=rejected, considered=considered, by=by)


def why_not(rejected: list[Rejected]) -> list[str]:
    """One line per GPU type: how many candidates fell out for each reason, and the closest."""
    lines: list[str] = []
    by_gpu: dict[str, list[Rejected]] = {}
    for r in rejected:
        by_gpu.setdefault(r.gpu, []).append(r)
    for gpu, rows in by_gpu.items():
        parts = []
        for kind in ("precision", "cluster", "layout", "memory", "deadline", "budget", "price"):
            hits = [r for r in rows if r.kind == kind]
            if not hits:
                continue
            best = min(hits, key=lambda r: r.need)
            if kind in ("precision", "price"):
                parts.append(best.reason)
            elif kind in ("cluster", "layout"):
                parts.append("; ".join(dict.fromkeys(r.reason for r in hits)))
            else:
                parts.append(f"{len(hits)} {_KIND_WORDS[kind]} (closest: {best.count} x {gpu} "
                             f"{best.layout}, {best.reason})")
        lines.append(f"{gpu}: " + "; ".join(parts))
    return lines


_KIND_WORDS = {"memory": "do not fit in memory", "deadline": "miss the deadline",
               "budget": "are over budget"}
