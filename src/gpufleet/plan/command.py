"""`gpufleet plan`: the edge around the pure planner. Reads the config.json and calibration files
a spec names, resolves defaults, renders tables, JSON and plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpufleet import catalog
from gpufleet.catalog import GpuType
from gpufleet.errors import SpecError
from gpufleet.parallelism import SHARDED, Layout, LayoutError, model_problems, precision_problem, resolve
from gpufleet.plan import calibration as calib
from gpufleet.plan import models, recommend
from gpufleet.plan.estimate import INTER_NODE, Plan, Workload, cluster_problems, estimate
from gpufleet.plan.models import Model, gib
from gpufleet.spec_plan import PlanSpec

DEFAULT_SEQ = 2048


def read_json(path: str, field: str) -> Any:
    try:
        return json.loads(Path(path).read_text("utf-8"))
    except FileNotFoundError:
        raise SpecError([(field, f"{path}: no such file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([(field, f"{path}: cannot read it ({exc})")]) from None
    except json.JSONDecodeError as exc:
        raise SpecError([(field, f"{path}: not JSON ({exc.msg} at line {exc.lineno})")]) from None


def load_model(spec: PlanSpec) -> Model:
    if spec.model is not None:
        return models.from_catalog(catalog.models()[spec.model])
    if spec.params is not None:
        return models.from_params(spec.params)
    assert spec.config is not None
    data = read_json(spec.config, "config")
    if not isinstance(data, dict):
        raise SpecError([("config", f"{spec.config}: a config.json holds one JSON object")])
    return models.from_hf_config(data, spec.config)


def calibration_path(given: str, home: Path) -> str:
    """`--calibration` as a path; a bare file name that is not in the current folder is looked
    up where `gpufleet bench` writes (`home`/calibrations), so `--calibration
    calibration-dev.json` finds what `bench allreduce --cluster dev` saved, from any folder."""
    path = Path(given)
    if path.exists() or path.parent != Path("."):
        return given
    saved = home / calib.FOLDER / path.name
    return str(saved) if saved.exists() else given


def load_calibration(path: str | None) -> calib.Calibration | None:
    if path is None:
        return None
    from gpufleet.home import home_path

    found = calibration_path(path, home_path())
    return calib.from_dict(read_json(found, "calibration"), found)


def workload_of(spec: PlanSpec, model: Model) -> Workload:
    seq = spec.seq or min(model.max_seq, DEFAULT_SEQ)
    if seq > model.max_seq and model.arch == "gpt2" and not model.shape_assumed:
        raise SpecError([("seq", f"got {seq}; {model.name} has learned positions for at most "
                          f"{model.max_seq} tokens")])
    rank = (spec.lora_rank or int(catalog.planner_defaults()["lora_rank"])) if spec.lora else None
    return Workload(model=model, seq=seq, micro_batch=spec.micro_batch, samples=spec.samples,
                    precision=spec.precision, framework=spec.framework, lora_rank=rank,
                    recompute="full" if spec.checkpointing else "none", attention=spec.attention,
                    sequence_parallel=spec.sequence_parallel, grad_accum=spec.grad_accum)


def default_network(gpu: GpuType, count: int) -> str:
    """One node: the type's own fabric when it reaches every GPU, else PCIe; more: InfiniBand."""
    if count > int(catalog.planner_defaults()["gpus_per_node"]):
        return "infiniband"
    fabric = catalog.interconnects()[gpu.node_fabric]
    return gpu.node_fabric if 1 < count <= fabric.max_gpus else "pcie"


def single(spec: PlanSpec, work: Workload) -> tuple[GpuType, int, str, Layout]:
    """The one cluster and layout the spec names, every problem reported at once."""
    assert spec.gpu is not None
    gpu = catalog.gpu_types()[spec.gpu]
    count = spec.count or 1
    network = spec.network or default_network(gpu, count)
    problems = cluster_problems(gpu, count, network)
    why = precision_problem(spec.precision, gpu.name, gpu.bf16, gpu.fp16_tflops > 0)
    if why:
        problems.append(("precision", why))
    try:
        layout = resolve(spec.strategy or "ddp", count, dp=spec.dp, tp=spec.tp, pp=spec.pp,
                         precision=spec.precision, schedule=spec.pp_schedule,
                         microbatches=spec.microbatches, framework=spec.framework)
    except LayoutError as exc:
        raise SpecError(problems + exc.problems) from None
    problems += model_problems(layout, work.model.layers, work.model.heads)
    if layout.tp > int(catalog.planner_defaults()["gpus_per_node"]):
        problems.append(("tp", f"tensor parallelism stays inside a node: at most "
                         f"{int(catalog.planner_defaults()['gpus_per_node'])}"))
    if problems:
        raise SpecError(problems)
    return gpu, count, network, layout


def search_filters(spec: PlanSpec) -> dict[str, Any]:
    return {
        "gpus": [catalog.gpu_types()[spec.gpu]] if spec.gpu else None,
        "counts": [spec.count] if spec.count else None,
        "networks": [spec.network] if spec.network else None,
        "strategies": [spec.strategy] if spec.strategy else None,
    }


def _emit_json(data: Any) -> None:
    """Plain JSON on stdout, for `| jq` and scripts (no colour, no wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


# -- rendering ----------------------------------------------------------------------------------
def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _hours(h: float) -> str:
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} days"


def render_plan(plan: Plan, console: Console) -> None:
    d = plan.to_dict()
    w = plan.workload
    console.print(f"[bold]{models.describe(plan.model)}[/bold]")
    trainable = (f", LoRA rank {w.lora_rank}: {w.trainable / 1e6:,.1f}M trainable "
                 f"({w.trainable / plan.model.params:.2%})" if w.lora_rank else "")
    console.print(f"on {plan.count} x {plan.gpu} over {plan.network}"
                  + (f" ({plan.nodes} nodes)" if plan.nodes > 1 else "")
                  + f" | {plan.layout.describe} | micro-batch {w.micro_batch} x {w.seq} tokens, "
                  f"global batch {plan.global_batch}"
                  + (", full activation checkpointing" if w.recompute == "full" else "") + trainable)

    mem = Table(title="Memory per GPU", title_justify="left", show_header=False)
    mem.add_column("part")
    mem.add_column("GiB", justify="right")
    for part in ("weights", "gradients", "optimizer", "activations", "buffers"):
        mem.add_row(part, f"{d['memory_gib'][part]:.2f}")
    cap = d["memory_gib"]["capacity"]
    verdict = ("fits" if plan.fits else "[red]does not fit[/red]") if plan.fits is not None else "host memory"
    mem.add_row("[bold]total[/bold]", f"[bold]{d['memory_gib']['total']:.2f}[/bold]")
    if cap is not None:
        mem.add_row("usable", f"{cap:.2f}")
    mem.caption = verdict
    console.print(mem)

    t = Table(title="Speed", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    bubble = f" (bubble {plan.bubble:.0%})" if plan.bubble else ""
    t.add_row("compute per step", f"{plan.compute_s:.3g} s{bubble}")
    t.add_row("communication, exposed", f"{plan.comm_exposed_s:.3g} s of {plan.comm_total_s:.3g} s "
              f"(dp {plan.dp_comm_s:.3g}, tp {plan.tp_comm_s:.3g}, pp {plan.pp_comm_s:.3g})")
    t.add_row("step", f"{plan.step_time_s:.3g} s")
    t.add_row("samples/s", f"{plan.samples_per_s:,.3g}")
    t.add_row("tokens/s", f"{plan.tokens_per_s:,.0f}")
    t.add_row("MFU", f"{plan.mfu:.1%}" if plan.mfu is not None else "-")
    t.add_row("scaling efficiency vs 1 GPU", f"{plan.scaling_efficiency:.1%}")
    if plan.wall_time_h is not None:
        t.add_row(f"time for {w.samples:,} samples", _hours(plan.wall_time_h))
    console.print(t)

    if plan.cost_usd:
        c = Table(title=f"Cost for {w.samples:,} samples", title_justify="left")
        c.add_column("price book")
        c.add_column("$/hour", justify="right")
        c.add_column("total", justify="right")
        for book, usd in sorted(plan.cost_usd.items(), key=lambda kv: kv[1]):
            c.add_row(book, f"{plan.usd_per_hour[book]:,.2f}", _usd(usd))
        if d["saving"]:
            s = d["saving"]
            c.caption = f"{s['cheapest']} saves {_usd(s['usd'])} ({s['fraction']:.0%})"
        console.print(c)
    elif w.samples is None:
        console.print("Time and cost: give --samples N.")
    else:
        console.print(f"Cost: no price book offers {plan.gpu}.")
    rates = d["rates"]
    how = ", ".join(rates["calibrated"]) if rates["calibrated"] else "catalog peaks and default efficiencies"
    console.print(f"[dim]Rates: {plan.device_tflops:,.4g} TFLOPS per device sustained"
                  + (f" of {plan.peak_tflops:,.4g} peak" if plan.peak_tflops else "")
                  + (f"; data-parallel link {plan.bandwidths_gbps['data_parallel']:,.4g} GB/s"
                     if plan.layout.dp > 1 else "") + f"; from {how}. "
                  "Formulas: docs/planning.md[/dim]")
    for note in plan.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if plan.fits is False:
        tries = []
        if "parameters" not in SHARDED[plan.layout.data_parallel]:
            tries.append("--strategy fsdp")
        if w.recompute != "full":
            tries.append("--checkpointing")
        if w.micro_batch > 1:
            tries.append("a smaller --micro-batch")
        tries += ["more GPUs", "or rank every cluster with --deadline/--budget"]
        console.print("Does not fit: try " + ", ".join(tries) + ".")


def render_ranking(r: recommend.Ranking, top: int, console: Console) -> None:
    order = "cheapest first" if r.by == "cost" else "fastest first"
    t = Table(title=f"{len(r.ranked)} of {r.considered} clusters qualify ({order})", title_justify="left")
    books = catalog.price_books()
    for col in ("#", "GPUs", "network", "layout", "GiB/GPU", "samples/s", "MFU", "time", *books):
        t.add_column(col, justify="left" if col in ("GPUs", "network", "layout") else "right")
    for i, p in enumerate(r.ranked[:top], 1):
        costs = p.cost_usd
        t.add_row(str(i), f"{p.count} x {p.gpu}", p.network, recommend.short_layout(p.layout),
                  f"{gib(p.total):.1f}",
                  f"{p.samples_per_s:,.3g}", f"{p.mfu:.0%}" if p.mfu is not None else "-",
                  _hours(p.wall_time_h) if p.wall_time_h is not None else "-",
                  *(_usd(costs[b]) if b in costs else "-" for b in books))
    if r.ranked:
        console.print(t)
    else:
        console.print(f"[red]None of {r.considered} clusters qualifies.[/red] Relax the deadline or "
                      "budget, add --checkpointing or --lora, or lower --micro-batch.")
    lines = recommend.why_not(r.rejected)
    if lines:
        console.print("Why the others do not qualify:" if r.ranked else "Why:")
        for line in lines:
            console.print(f"  {line}")


def list_models(as_json: bool, console: Console) -> None:
    rows = [(m, models.from_catalog(m)) for m in catalog.models().values()]
    if as_json:
        _emit_json([{"name": m.name, "params": p.params, "layers": m.layers,
                                        "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
                                        "vocab": m.vocab, "max_seq": m.seq, "source": m.source}
                    for m, p in rows])
        return
    t = Table(title="Models the planner knows (--model NAME)", title_justify="left")
    for col in ("name", "params", "layers", "hidden", "heads (KV)", "vocab", "max seq"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for m, p in rows:
        t.add_row(m.name, f"{p.params / 1e9:.2f}B", str(m.layers), str(m.hidden),
                  f"{m.heads} ({m.kv_heads})", f"{m.vocab:,}", f"{m.seq:,}")
    t.caption = "Sources: gpufleet/catalog/data/models.csv. Others: --config config.json or --params 7e9"
    console.print(t)


def run(spec: PlanSpec, as_json: bool, plot: Path | None, console: Console) -> None:
    model = load_model(spec)
    work = workload_of(spec, model)
    cal = load_calibration(spec.calibration)
    if spec.gpu == "cpu" and (cal is None or cal.gpu != "cpu" or cal.achieved_tflops is None):
        raise SpecError([("calibration", "CPU workers have no rated peak: measure them with `gpufleet "
                          "bench scaling --cluster NAME --script SCRIPT --config MODEL.json` and pass "
                          "the file with --calibration")])
    if plot is not None:
        from gpufleet.plan import plot as plotting

        plotting.require(plot)
    if spec.searching:
        top = spec.top or 10
        ranking = recommend.rank(work, deadline_h=spec.deadline_h, budget_usd=spec.budget,
                                 calibration=cal, **search_filters(spec))
        if as_json:
            kinds: dict[str, int] = {}
            for rej in ranking.rejected:
                kinds[rej.kind] = kinds.get(rej.kind, 0) + 1
            _emit_json({
                "by": ranking.by, "considered": ranking.considered, "qualifying": len(ranking.ranked),
                "ranked": [p.to_dict() for p in ranking.ranked[:top]],
                "rejected": kinds, "why_not": recommend.why_not(ranking.rejected)})
        else:
            render_ranking(ranking, top, console)
        if plot is not None:
            plotting.ranking(ranking, plot)
            if not as_json:
                console.print(f"Plot: {plot}")
        return
    gpu, count, network, layout = single(spec, work)
    plan = estimate(work, gpu, count, network, layout, cal)
    if as_json:
        _emit_json(plan.to_dict())
    else:
        render_plan(plan, console)
    if plot is not None:
        sweep = []
        per_node = int(catalog.planner_defaults()["gpus_per_node"])
        for n in recommend.COUNTS:
            net = network if (n > per_node) == (count > per_node) else default_network(gpu, n)
            try:
                lay = resolve(layout.strategy, n, tp=layout.tp if layout.tp <= n else None,
                              precision=layout.precision, framework=layout.framework,
                              schedule=layout.schedule)
            except LayoutError:
                continue
            if n > per_node and net not in INTER_NODE:
                net = "infiniband"
            if cluster_problems(gpu, n, net):
                continue
            sweep.append(estimate(work, gpu, n, net, lay, cal))
        plotting.single(plan, sweep, plot)
        if not as_json:
            console.print(f"Plot: {plot}")
