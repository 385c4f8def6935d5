"""Terminal rendering with rich: quotes, tables, the live job panel and the final summary.

Formatting only; every number comes from `plan.cost` or `supervise.view`.
"""

from __future__ import annotations

from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

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
    t = Table(title=f"Quote: {count} x {gpu} over {network}", title_justify="left")
    for col in ("price book", "instance", "$/GPU-hour", "network premium", "$/hour", ""):
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
        f"cost {usd(v.cost_usd)}  ETA {duration(v.eta_s)}  elapsed {duration(v.elapsed_s)}",
    )
    grid = Table.grid()
    grid.add_row(bar)
    grid.add_row(line)
    title = f"{v.job} on {v.cluster} ({v.world_size} x {v.gpu}) - {v.status}"
    return Panel(grid, title=title, title_align="left")


def progress_line(v: JobView) -> str:
    return (f"[gpufleet] {v.job} step {v.step or 0}/{v.total_steps or '?'} "
            f"samples/s {num(v.samples_per_s, '.1f')} loss {num(v.loss)} "
            f"cost {usd(v.cost_usd)} ETA {duration(v.eta_s)}")


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
        ("cluster", f"{v.cluster} ({v.world_size} x {v.gpu})"),
        ("steps", f"{v.step or 0}/{v.total_steps or '?'}"),
        ("final loss", loss),
        ("samples/s", num(v.samples_per_s, ".1f")),
        ("wall time", duration(v.elapsed_s)),
        ("cost", f"{usd(v.cost_usd)} at {usd(v.usd_per_hour)}/hour ({v.price_book or 'unpriced'})"),
    ]
    if v.layout:
        rows.insert(1, ("layout", v.layout))
    if v.model_state:
        rows.append(("model state", model_state_line(v.model_state)))
    for k, val in rows:
        t.add_row(k, Text(val))  # Text: log lines may hold '[...]', which is not rich markup
    if v.status != "succeeded" and v.reason:
        t.add_row("reason", Text(v.reason))
    return t
