"""GPU types, interconnects and price books, loaded from the CSV files in `data/`.

Every number lives in a data file next to its source; this module only parses and looks up.
Loaders are cached: the files are read once per process.
"""

from __future__ import annotations

import csv
import difflib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpufleet.errors import SpecError, excerpt


@dataclass(frozen=True)
class GpuType:
    name: str
    aliases: tuple[str, ...]
    arch: str
    memory_gb: float  # vendor-stated device memory (0 for CPU slots: they share host RAM)
    bf16_tflops: float  # dense tensor-core peak; 0 when BF16 is unsupported
    fp16_tflops: float
    fp32_tflops: float
    mem_bw_gbps: float  # GB/s
    bf16: bool
    nvml_match: tuple[str, ...]  # substrings of NVML's device name that identify this type
    nvlink_gbps: float  # NVLink GB/s per direction per GPU (0: none); caps nvlink/nvswitch links
    node_fabric: str  # the fabric inside a typical 8-GPU server of this type
    source: str

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"


@dataclass(frozen=True)
class Interconnect:
    name: str
    scope: str  # "intra-node" or "inter-node"
    bw_gbps_per_direction: float  # GB/s per GPU
    latency_us: float
    max_gpus: int  # largest domain the fabric connects (per node for intra-node fabrics)
    source: str


@dataclass(frozen=True)
class Price:
    book: str
    item: str
    kind: str  # "gpu", "cpu" or "interconnect"
    usd_per_gpu_hour: float
    instance: str
    source: str


def _rows(filename: str) -> list[dict[str, str]]:
    text = resources.files("gpufleet.catalog").joinpath("data", filename).read_text("utf-8")
    return list(csv.DictReader(text.splitlines()))


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(";") if v.strip())


def _key(name: str) -> str:
    """Lookup key: case, spaces, dashes and underscores do not matter ('rtx 4090' = 'RTX4090')."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@cache
def gpu_types() -> dict[str, GpuType]:
    out: dict[str, GpuType] = {}
    for r in _rows("gpus.csv"):
        out[r["name"]] = GpuType(
            name=r["name"],
            aliases=_split(r["aliases"]),
            arch=r["arch"],
            memory_gb=float(r["memory_gb"]),
            bf16_tflops=float(r["bf16_tflops"]),
            fp16_tflops=float(r["fp16_tflops"]),
            fp32_tflops=float(r["fp32_tflops"]),
            mem_bw_gbps=float(r["mem_bw_gbps"]),
            bf16=r["bf16"].strip().lower() == "true",
            nvml_match=_split(r["nvml_match"]),
            nvlink_gbps=float(r["nvlink_gbps"]),
            node_fabric=r["node_fabric"],
            source=r["source"],
        )
    return out


@cache
def _gpu_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for gpu in gpu_types().values():
        for label in (gpu.name, *gpu.aliases):
            index[_key(label)] = gpu.name
    return index


def resolve_gpu(name: str, field: str = "gpu") -> GpuType:
    """The catalog type for a user-typed name, or a SpecError with a 'did you mean' hint."""
    found = _gpu_index().get(_key(name))
    if found is not None:
        return gpu_types()[found]
    names = list(gpu_types())
    close = difflib.get_close_matches(_key(name), list(_gpu_index()), n=1, cutoff=0.5)
    hint = f"did you mean '{_gpu_index()[close[0]]}'? " if close else ""
    raise SpecError([(field, f"unknown GPU type '{excerpt(name)}'; {hint}known: {', '.join(names)}")])


def gpu_from_nvml_name(nvml_name: str) -> GpuType | None:
    """Map NVML's device name ('NVIDIA H100 80GB HBM3') to a catalog type; None if unknown."""
    best: tuple[int, GpuType] | None = None
    for gpu in gpu_types().values():
        for pattern in gpu.nvml_match:
            # at a word start, so 'H200' does not match Grace Hopper's 'GH200'
            hit = re.search(r"(?:^|[\s-])" + re.escape(pattern), nvml_name, re.IGNORECASE)
            if hit and (best is None or len(pattern) > best[0]):
                best = (len(pattern), gpu)
    return best[1] if best else None


@cache
def interconnects() -> dict[str, Interconnect]:
    return {
        r["name"]: Interconnect(
            name=r["name"],
            scope=r["scope"],
            bw_gbps_per_direction=float(r["bw_gbps_per_direction"]),
            latency_us=float(r["latency_us"]),
            max_gpus=int(r["max_gpus"]),
            source=r["source"],
        )
        for r in _rows("interconnects.csv")
    }


@cache
def prices() -> tuple[Price, ...]:
    return tuple(
        Price(
            book=r["book"],
            item=r["item"],
            kind=r["kind"],
            usd_per_gpu_hour=float(r["usd_per_gpu_hour"]),
            instance=r["instance"],
            source=r["source"],
        )
        for r in _rows("prices.csv")
    )


def price_books() -> tuple[str, ...]:
    """Book names in file order (the marketplace first, as the seeds present it)."""
    return tuple(dict.fromkeys(p.book for p in prices()))


def price_of(book: str, item: str) -> Price | None:
    for p in prices():
        if p.book == book and p.item == item:
            return p
    return None


@dataclass(frozen=True)
class ModelType:
    """A model's shape, enough to count its parameters and size its activations.

    `arch` picks the parameter-count formula: "gpt2" (biases, LayerNorm, learned positions,
    two-matrix MLP) or "llama" (no biases, RMSNorm, rotary positions, SwiGLU's three matrices,
    grouped-query attention).
    """

    name: str
    aliases: tuple[str, ...]
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int  # longest sequence the model takes (learned position embeddings count it)
    tied: bool  # output head shares the embedding matrix
    stated_params: float  # the count its source publishes, to check the formula against
    source: str


@cache
def models() -> dict[str, ModelType]:
    return {
        r["name"]: ModelType(
            name=r["name"], aliases=_split(r["aliases"]), arch=r["arch"],
            layers=int(r["layers"]), hidden=int(r["hidden"]), heads=int(r["heads"]),
            kv_heads=int(r["kv_heads"]), ffn=int(r["ffn"]), vocab=int(r["vocab"]),
            seq=int(r["seq"]), tied=r["tied"].strip().lower() == "true",
            stated_params=float(r["stated_params"]), source=r["source"],
        )
        for r in _rows("models.csv")
    }


def resolve_model(name: str, field: str = "model") -> ModelType:
    """The catalog model for a user-typed name, or a SpecError listing the known ones."""
    index = {_key(label): m.name for m in models().values() for label in (m.name, *m.aliases)}
    found = index.get(_key(name))
    if found is not None:
        return models()[found]
    close = difflib.get_close_matches(_key(name), list(index), n=1, cutoff=0.6)
    hint = f"did you mean '{index[close[0]]}'? " if close else ""
    raise SpecError([(field, f"unknown model '{excerpt(name)}'; {hint}known: {', '.join(models())}")])


@cache
def planner_defaults() -> dict[str, float]:
    """The planner's assumptions (efficiencies, reserves) by name; see planner.csv's sources."""
    return {r["name"]: float(r["value"]) for r in _rows("planner.csv")}
