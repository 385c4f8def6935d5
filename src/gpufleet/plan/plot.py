"""`plan --plot FILE.png`: the memory breakdown, and time and cost against the GPU count, for
people. matplotlib is an optional extra (`pip install 'gpufleet[plot]'`), imported only here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpufleet.errors import GpufleetError, SpecError
from gpufleet.plan.estimate import Plan
from gpufleet.plan.models import gib
from gpufleet.plan.recommend import Ranking

PARTS = ("weights", "gradients", "optimizer", "activations", "buffers")


def require(path: Path) -> None:
    """Fail before any work when the plot cannot be written: matplotlib missing (one line, the
    install command), a name that is not .png, or a folder that is not there or not writable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise GpufleetError("plot: matplotlib is not installed; pip install 'gpufleet[plot]' "
                            "(or drop --plot)") from None
    if path.suffix.lower() != ".png":
        raise SpecError([("plot", f"{path}: the file name must end in .png")])
    folder = path.parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise SpecError([("plot", f"{path}: cannot write there; give a .png file in an existing, "
                          "writable folder")])


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise GpufleetError(f"plot: cannot write {path}: {exc}") from None


def single(plan: Plan, sweep: list[Plan], path: Path) -> None:
    """Left: this plan's memory per GPU, stacked, against the usable memory. Right: wall time
    and cheapest cost (or samples/s without --samples) for 1..128 GPUs, misfits hollow."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    bottom = 0.0
    for part in PARTS:
        value = gib(getattr(plan, part))
        left.bar([f"{plan.count} x {plan.gpu}"], [value], bottom=bottom, label=part)
        bottom += value
    if plan.capacity is not None:
        left.axhline(gib(plan.capacity), color="red", linestyle="--", label="usable")
    left.set_ylabel("GiB per GPU")
    left.set_title("Memory per GPU (" + ("fits" if plan.fits else "does not fit") + ")")
    left.legend(fontsize=8)

    counts = [p.count for p in sweep]
    timed = plan.workload.samples is not None
    ys = [p.wall_time_h if timed else p.samples_per_s for p in sweep]
    fits = [p.fits is not False for p in sweep]
    right.plot(counts, ys, color="tab:blue")
    right.scatter(counts, ys, facecolors=["tab:blue" if f else "none" for f in fits],
                  edgecolors="tab:blue", zorder=3)
    right.set_xscale("log", base=2)
    right.set_xlabel("GPUs")
    right.set_ylabel("hours for the samples" if timed else "samples/s", color="tab:blue")
    right.set_title(f"{plan.gpu}, {plan.layout.strategy}: hollow = does not fit")
    costs = [p.cheapest_usd for p in sweep]
    if timed and any(c is not None for c in costs):
        twin = right.twinx()
        twin.plot(counts, [c if c is not None else float("nan") for c in costs], color="tab:green")
        twin.set_ylabel("cheapest cost, $", color="tab:green")
    _save(fig, path)
    plt.close(fig)


def ranking(r: Ranking, path: Path) -> None:
    """Every qualifying cluster as a point of wall time against cheapest cost, by GPU type."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    by_gpu: dict[str, list[Plan]] = {}
    for p in r.ranked:
        if p.wall_time_h is not None and p.cheapest_usd is not None:
            by_gpu.setdefault(p.gpu, []).append(p)
    for gpu, plans in by_gpu.items():
        ax.scatter([p.wall_time_h for p in plans], [p.cheapest_usd for p in plans], label=gpu, alpha=0.7)
    ax.set_xlabel("hours")
    ax.set_ylabel("cheapest cost, $")
    ax.set_title(f"{len(r.ranked)} qualifying clusters")
    if by_gpu:
        ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
