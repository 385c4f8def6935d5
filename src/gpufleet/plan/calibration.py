"""What `gpufleet bench` measured, kept in a file that `plan --calibration` reads instead of the
catalog's rated peaks and default efficiencies. Pure: dicts in, dicts out; the CLI reads and
writes the file.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpufleet.errors import SpecError

KIND = "gpufleet-calibration"
VERSION = 1
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
FOLDER = "calibrations"  # under $GPUFLEET_HOME: where `gpufleet bench` writes without --out


def file_name(cluster: str) -> str:
    """The file a bench of `cluster` writes into FOLDER, and `plan --calibration` finds by name."""
    return f"calibration-{cluster}.json"


@dataclass(frozen=True)
class CollectivePoint:
    op: str
    bytes: int
    seconds: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class ScalingPoint:
    workers: int
    samples_per_s: float
    usd_per_1k_samples: float | None = None
    # samples/s x FLOPs per sample / workers, when bench knew the model
    tflops_per_device: float | None = None


@dataclass(frozen=True)
class Calibration:
    gpu: str
    network: str
    host_cpus: int | None = None  # CPU slots share the host's cores; threads = host_cpus // workers
    collective_workers: int | None = None
    collectives: tuple[CollectivePoint, ...] = ()
    # Sustained TFLOP/s of one device running the script alone, and the threads it had (CPU).
    achieved_tflops: float | None = None
    threads_per_worker: int | None = None
    precision: str | None = None  # of the scaling runs the compute rate came from
    scaling: tuple[ScalingPoint, ...] = ()
    scaling_script: str | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["collectives"] = [asdict(c) for c in self.collectives]
        data["scaling"] = [asdict(p) for p in self.scaling]
        data["notes"] = list(self.notes)
        return {"kind": KIND, "version": VERSION, **data}


def from_dict(data: Any, where: str) -> Calibration:
    """Parse a calibration file's JSON; a SpecError names the file and what is wrong with it."""
    def bad(why: str) -> SpecError:
        return SpecError([("calibration", f"{where}: {why}; make one with `gpufleet bench "
                           "allreduce` or `gpufleet bench scaling`")])

    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise bad(f"not a gpufleet calibration file (no \"kind\": \"{KIND}\")")
    if data.get("version") != VERSION:
        raise bad(f"version {data.get('version')!r} is not supported (this gpufleet reads {VERSION})")
    try:
        cal = Calibration(
            gpu=str(data["gpu"]), network=str(data["network"]),
            host_cpus=_opt_int(data.get("host_cpus")),
            collective_workers=_opt_int(data.get("collective_workers")),
            collectives=tuple(CollectivePoint(op=str(c["op"]), bytes=int(c["bytes"]),
                                              seconds=float(c["seconds"]),
                                              algbw_gbps=float(c["algbw_gbps"]),
                                              busbw_gbps=float(c["busbw_gbps"]))
                              for c in data.get("collectives", [])),
            achieved_tflops=_opt_float(data.get("achieved_tflops")),
            threads_per_worker=_opt_int(data.get("threads_per_worker")),
            precision=data.get("precision"),
            scaling=tuple(ScalingPoint(workers=int(p["workers"]), samples_per_s=float(p["samples_per_s"]),
                                       usd_per_1k_samples=_opt_float(p.get("usd_per_1k_samples")),
                                       tflops_per_device=_opt_float(p.get("tflops_per_device")))
                          for p in data.get("scaling", [])),
            scaling_script=data.get("scaling_script"),
            notes=tuple(str(n) for n in data.get("notes", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"malformed entry ({type(exc).__name__}: {exc})") from None
    why = _implausible(cal)
    if why:
        raise bad(why)
    return cal


def _positive(x: float | None) -> bool:
    return x is None or (math.isfinite(x) and x > 0)


def _implausible(cal: Calibration) -> str | None:
    """A measurement no bench can have produced: sizes, times and rates must be finite and above
    zero, ops known (a zero size would break the interpolation, a negative rate the plan)."""
    for c in cal.collectives:
        if c.op not in OPS:
            return f"unknown collective '{c.op}'; known: {', '.join(OPS)}"
        if not all(_positive(v) for v in (c.bytes, c.seconds, c.algbw_gbps, c.busbw_gbps)):
            return f"{c.op} at {c.bytes} bytes: sizes, times and bandwidths must be above zero"
    for p in cal.scaling:
        if p.workers < 1 or not all(_positive(v) for v in (p.samples_per_s, p.tflops_per_device)):
            return f"scaling at {p.workers} workers: worker counts and rates must be above zero"
    for name, value in (("achieved_tflops", cal.achieved_tflops), ("host_cpus", cal.host_cpus),
                        ("threads_per_worker", cal.threads_per_worker)):
        if not _positive(value):
            return f"{name} must be above zero, got {value}"
    return None


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def merge(old: Calibration | None, new: Calibration) -> Calibration:
    """Keep what the other bench measured: `bench allreduce` and `bench scaling` write the same
    file, each replacing only its own part. A file of another GPU type or network is replaced."""
    if old is None or (old.gpu, old.network) != (new.gpu, new.network):
        return new
    return replace(
        new,
        host_cpus=new.host_cpus or old.host_cpus,
        collective_workers=new.collective_workers if new.collectives else old.collective_workers,
        collectives=new.collectives or old.collectives,
        achieved_tflops=new.achieved_tflops if new.achieved_tflops is not None else old.achieved_tflops,
        threads_per_worker=new.threads_per_worker or old.threads_per_worker,
        precision=new.precision or old.precision,
        scaling=new.scaling or old.scaling,
        scaling_script=new.scaling_script or old.scaling_script,
    )


def busbw_at(cal: Calibration, op: str, size: float) -> float | None:
    """Measured bus bandwidth (GB/s) of `op` at `size` bytes: interpolated in log(size) between
    the two nearest measured sizes, the end value beyond them; None if `op` was not measured.
    all_gather and reduce_scatter stand in for each other (the same ring traffic)."""
    points = sorted((c.bytes, c.busbw_gbps) for c in cal.collectives if c.op == op)
    if not points and op in ("all_gather", "reduce_scatter"):
        other = "reduce_scatter" if op == "all_gather" else "all_gather"
        points = sorted((c.bytes, c.busbw_gbps) for c in cal.collectives if c.op == other)
    if not points:
        return None
    if size <= points[0][0]:
        return points[0][1]
    if size >= points[-1][0]:
        return points[-1][1]
    for (s0, b0), (s1, b1) in itertools.pairwise(points):
        if s0 <= size <= s1:
            w = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0)) if s1 > s0 else 0.0
            return b0 + w * (b1 - b0)
    return points[-1][1]


def device_tflops(cal: Calibration, workers: int) -> float | None:
    """Sustained TFLOP/s of one device when `workers` run.

    GPUs: the rate bench measured with the fewest workers (alone, no communication in it); a
    device's speed does not depend on how many others run. CPU slots share the host's cores
    (gpufleet gives each worker host_cpus // workers threads), so a CPU worker's speed does:
    the rate measured at that worker count if bench ran it, else the base rate scaled by
    threads (threads scale sublinearly on small matrices, so measuring is better).
    """
    if cal.gpu == "cpu":
        measured = {p.workers: p.tflops_per_device for p in cal.scaling if p.tflops_per_device}
        if workers in measured:
            return measured[workers]
    if cal.achieved_tflops is None:
        return None
    if cal.gpu != "cpu" or not cal.host_cpus or not cal.threads_per_worker:
        return cal.achieved_tflops
    threads = max(1, cal.host_cpus // max(1, workers))
    return cal.achieved_tflops * threads / cal.threads_per_worker
