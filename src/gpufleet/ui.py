"""Terminal rendering with rich: quotes, tables, the live job panel and the final summary.

Formatting only; every number comes from `plan.cost` or `supervise.view`. Those are imported
where they are used, so `list` and `prices` do not load the job view's modules.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gpufleet import slot_words
from gpufleet.slot_words import devices_shown
from gpufleet.status import JOB_ACTIVE, JobStatus

if TYPE_CHECKING:
    from gpufleet.plan import cost
    from gpufleet.supervise.view import JobView


def usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def quote_table(gpu: str, count: int, network: str, rates: list[cost.Rate],
                book: str | None) -> Table:
    from gpufleet.plan import cost

    t = Table(title=f"Quote: {slot_words.devices_shown(gpu, count)} over "
              f"{slot_words.network_shown(gpu, network)}", title_justify="left")
    for col in ("price book", "instance", f"$/{slot_words.unit(gpu)}-hour", "network premium",
                "$/hour", ""):
        t.add_column(col, justify="right" if "$" in col or "premium" in col else "left")
    for r in rates:
        t.add_row(r.book, r.instance or "-", usd(r.gpu_usd_per_hour),
                  usd(r.premium_usd_per_hour), usd(r.usd_per_hour),
                  "billed" if r.book == book else "")
    if not rates:
        t.add_row("(none)", "-", "-", "-", "$0", "no price book offers this type")
    save = cost.saving(rates)
    if save is not None:
        t.caption = (f"{rates[0].book} saves {usd(save[0])}/hour ({save[1]:.0%}) "
                     f"against {rates[-1].book}")
    return t


def job_panel(v: JobView) -> Panel:
    done = v.step or 0
    total = v.total_steps or 0
    bar = ProgressBar(total=max(total, 1), completed=min(done, total) if total else 0, width=40)
    line = Text.assemble(
        (f"step {done}/{total or '?'}  ", "bold"),
        f"samples/s {num(v.samples_per_s, '.1f')}  loss {num(v.loss)}  ",
        f"cost {usd(v.cost_usd)}  ETA {duration(v.eta_s)}  "
        f"projected {usd(v.projected_cost_usd)}  elapsed {duration(v.elapsed_s)}",
    )
    grid = Table.grid()
    grid.add_row(bar)
    grid.add_row(line)
    if v.no_report_s is not None:  # the hang timeout may still be minutes away
        grid.add_row(Text(quiet_text(v.no_report_s), style="bold yellow"))
    title = f"{v.job} on {v.cluster} ({devices_shown(v.gpu, v.world_size)}) - {v.status}"
    return Panel(grid, title=title, title_align="left")


def quiet_text(seconds: float) -> str:
    """`no report for 42 s`: rank 0 has gone quiet (supervise.view.no_report_s)."""
    return f"no report for {seconds:.0f} s"


def progress_line(v: JobView) -> str:
    return (f"[gpufleet] {v.job} step {v.step or 0}/{v.total_steps or '?'} "
            f"samples/s {num(v.samples_per_s, '.1f')} loss {num(v.loss)} "
            f"cost {usd(v.cost_usd)} ETA {duration(v.eta_s)}"
            + (f" {quiet_text(v.no_report_s)}" if v.no_report_s is not None else ""))


def model_state_line(state: dict[int, dict[str, float]]) -> str:
    """Per-rank model state in MiB, as a range over ranks when they differ (pipeline stages)."""
    parts = []
    for key, label in (("params_bytes", "params"), ("grads_bytes", "grads"),
                       ("optimizer_bytes", "optimizer"), ("cuda_max_allocated_bytes", "cuda peak")):
        values = [s[key] / 2**20 for s in state.values() if key in s]
        if values:
            lo, hi = min(values), max(values)
            parts.append(f"{label} {lo:.2f}" + (f"-{hi:.2f}" if hi - lo >= 0.005 else "") + " MiB")
    return ", ".join(parts) + f" per rank ({len(state)} ranks)"


def summary_table(v: JobView) -> Table:
    t = Table(title=f"Job {v.job}: {v.status}", title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    loss = num(v.loss)
    if v.first_loss is not None and v.loss is not None:
        loss = f"{v.loss:.3f} (from {v.first_loss:.3f})"
    rows = [
        ("cluster", f"{v.cluster} ({devices_shown(v.gpu, v.world_size)})"),
        ("steps", f"{v.step or 0}/{v.total_steps or '?'}"),
        ("final loss", loss),
        ("samples/s", num(v.samples_per_s, ".1f")),
        ("wall time", duration(v.elapsed_s)),
        ("cost", f"{usd(v.cost_usd)} at {usd(v.usd_per_hour)}/hour ({v.price_book or 'unpriced'})"),
    ]
    if v.layout:
        rows.insert(1, ("layout", v.layout))
    if v.image:
        rows.insert(1, ("image", v.image))
    if v.model_state:
        rows.append(("model state", model_state_line(v.model_state)))
    for k, val in rows:
        t.add_row(k, Text(val))  # Text: log lines may hold '[...]', which is not rich markup
    if v.status != JobStatus.SUCCEEDED and v.reason:
        t.add_row("reason", Text(v.reason))
    return t


def durable_line(copy: dict[str, Any]) -> Text:
    """`durable copy: step 20 (behind: step 30 failed: No space left on device)`."""
    return Text(f"durable copy: {copy['text']}", style="bold yellow" if copy["behind"] else "")


_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f} MiB"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def status_view(detail: dict[str, Any]) -> RenderableType:
    """`gpufleet status`: the job panel (or summary once ended), devices, ranks, findings and
    events, from `views.job_detail` (what the dashboard shows)."""
    from gpufleet.supervise.view import JobView

    # a field a server of an earlier version does not send keeps its default
    v = JobView(**{k: detail[k] for k in JobView.__dataclass_fields__ if k in detail})
    parts: list[RenderableType] = [
        job_panel(v) if v.status in JOB_ACTIVE else summary_table(v)]
    copy = detail.get("durable_copy")
    if copy:  # a copy behind is easy to miss otherwise: training goes on, the job succeeds
        parts.append(durable_line(copy))
    latest: dict[str, dict[str, float]] = detail.get("latest", {})
    devices = {k: m for k, m in latest.items() if "gpu_utilization" in m
               or "gpu_memory_used_bytes" in m}
    if devices:
        t = Table(title="Devices", title_justify="left")
        for col in ("device", "utilization", "memory", "power", "temp"):
            t.add_column(col, justify="left" if col == "device" else "right")
        for key, m in sorted(devices.items()):
            total = m.get("gpu_memory_total_bytes")
            used = m.get("gpu_memory_used_bytes")
            mem = _mib(used) + (f" / {_mib(total)}" if total else "")
            t.add_row(key, _pct(m.get("gpu_utilization")), mem,
                      num(m.get("gpu_power_watts"), ".0f") + " W" if "gpu_power_watts" in m else "-",
                      num(m.get("gpu_temperature_celsius"), ".0f") + " C"
                      if "gpu_temperature_celsius" in m else "-")
        parts.append(t)
    ranks = {k: m for k, m in latest.items() if k.startswith("rank ") and "step_time_seconds" in m}
    if ranks:
        t = Table(title="Ranks", title_justify="left")
        for col in ("rank", "step", "data wait", "communication", "bus bandwidth"):
            t.add_column(col, justify="left" if col == "rank" else "right")
        for key, m in sorted(ranks.items(), key=lambda kv: int(kv[0].split()[1])):
            bw = m.get("comm_bandwidth_bytes_per_second")
            t.add_row(key[5:], _ms(m.get("step_time_seconds")), _ms(m.get("data_wait_seconds")),
                      _ms(m.get("comm_seconds")), "-" if bw is None else f"{bw / 1e9:.2f} GB/s")
        parts.append(t)
    findings = detail.get("findings", [])
    if findings:
        t = Table(title="Diagnosis", title_justify="left", show_lines=True)
        for col in ("", "finding", "try"):
            t.add_column(col)
        for f in findings:
            mark = f["severity"] if f["active"] else f"{f['severity']} (cleared)"
            what = Text.assemble((f["title"], "bold"), "\n", f["detail"])
            t.add_row(Text(mark, style=_SEVERITY_STYLE.get(f["severity"], "")), what,
                      Text(f["fix"]))
        parts.append(t)
    events = detail.get("events", [])
    if events:
        t = Table(title="Events", title_justify="left")
        for col in ("time", "event", "reason"):
            t.add_column(col)
        for e in events[-12:]:
            t.add_row(time.strftime("%H:%M:%S", time.localtime(e["time"])), e["kind"],
                      Text(e["reason"]))
        parts.append(t)
    return Group(*parts)
