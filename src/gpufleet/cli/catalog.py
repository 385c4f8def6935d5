"""`prices` (alias `show-gpus`): the GPU catalog and its price books, from the CSVs alone."""

from __future__ import annotations

from gpufleet.cli.app import COMMAND, app, out, print_json
from gpufleet.cli.options import GpuFilter, Json


def show_prices(gpu: str | None, as_json: bool) -> None:
    from rich.table import Table

    from gpufleet import catalog

    wanted = catalog.resolve_gpu(gpu).name if gpu else None
    rows = []
    for g in catalog.gpu_types().values():
        if wanted and g.name != wanted:
            continue
        per_book = {b: catalog.price_of(b, g.name) for b in catalog.price_books()}
        rows.append((g, per_book))
    if as_json:
        print_json([{
            "gpu": g.name, "memory_gb": g.memory_gb, "bf16": g.bf16,
            "bf16_tflops": g.bf16_tflops, "fp32_tflops": g.fp32_tflops,
            "mem_bw_gbps": g.mem_bw_gbps,
            "usd_per_gpu_hour": {b: p.usd_per_gpu_hour if p else None for b, p in books.items()},
        } for g, books in rows])
        return
    t = Table(title="GPU types and prices ($ per GPU-hour)", title_justify="left")
    for col in ("GPU", "memory", "BF16", "BF16 TFLOPS", "FP32 TFLOPS", "mem GB/s",
                *catalog.price_books()):
        t.add_column(col, justify="left" if col in ("GPU", "BF16") else "right",
                     min_width=len(col) if col in catalog.price_books() or col == "GPU" else None,
                     no_wrap=col == "GPU")
    for g, books in rows:
        t.add_row(g.name, f"{g.memory_gb:g} GB" if g.memory_gb else "host",
                  "yes" if g.bf16 else "no", f"{g.bf16_tflops:g}" if g.bf16_tflops else "-",
                  f"{g.fp32_tflops:g}" if g.fp32_tflops else "-",
                  f"{g.mem_bw_gbps:g}" if g.mem_bw_gbps else "-",
                  *(f"{p.usd_per_gpu_hour:.4g}" if p else "-" for p in books.values()))
    premiums = [p for p in catalog.prices() if p.kind == "interconnect"]
    t.caption = "cpu: per CPU slot-hour (one worker on this host's cores). " \
        "Network premiums per GPU-hour: " + ", ".join(
            f"{p.item} +${p.usd_per_gpu_hour:.2f} ({p.book})" for p in premiums
        ) + ". Sources: gpufleet/catalog/data/*.csv"
    out.print(t)


@app.command(cls=COMMAND)
def prices(gpu: GpuFilter = None, as_json: Json = False) -> None:
    """GPU types, their specs and $/GPU-hour under each price book."""
    show_prices(gpu, as_json)


@app.command("show-gpus", cls=COMMAND)
def show_gpus(gpu: GpuFilter = None, as_json: Json = False) -> None:
    """Alias of `prices`."""
    show_prices(gpu, as_json)
