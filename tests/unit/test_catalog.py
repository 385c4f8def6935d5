"""The catalog data files: required rows, sources, sane numbers, seed prices, NVML name mapping."""

from __future__ import annotations

import csv
import dataclasses
import typing
from importlib import resources

import pytest

from gpufleet import catalog
from gpufleet.errors import SpecError
from gpufleet.launch.env import NCCL_BY_FABRIC
from gpufleet.pool.model import FABRIC_LEVEL
from gpufleet.spec import ClusterSpec
from gpufleet.vocab import IN_NODE_NETWORKS, INTER_NODE_NETWORKS, NETWORKS

CSV_FILES = ("gpus.csv", "interconnects.csv", "prices.csv")


def raw_rows(filename: str) -> list[dict[str, str]]:
    text = resources.files("gpufleet.catalog").joinpath("data", filename).read_text("utf-8")
    return list(csv.DictReader(text.splitlines()))


@pytest.mark.parametrize(
    "name", ["RTX3090", "RTX4090", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "cpu"]
)
def test_required_gpu_types_exist(name: str) -> None:
    assert catalog.gpu_types()[name].name == name


@pytest.mark.parametrize("filename", CSV_FILES)
def test_every_row_has_a_source(filename: str) -> None:
    rows = raw_rows(filename)
    assert rows, f"{filename} is empty"
    for row in rows:
        assert "source" in row
        assert row["source"] is not None and row["source"].strip(), row


@pytest.mark.parametrize("filename", CSV_FILES)
def test_rows_have_no_missing_or_extra_cells(filename: str) -> None:
    for row in raw_rows(filename):
        assert None not in row, f"extra cells in {row}"  # DictReader files extras under None
        assert all(v is not None for v in row.values()), f"missing cells in {row}"


def test_gpu_names_unique() -> None:
    names = [r["name"] for r in raw_rows("gpus.csv")]
    assert len(names) == len(set(names))


def test_no_alias_points_at_two_types() -> None:
    owner: dict[str, str] = {}
    for gpu in catalog.gpu_types().values():
        for label in (gpu.name, *gpu.aliases):
            key = catalog._key(label)
            assert owner.setdefault(key, gpu.name) == gpu.name, f"{label!r}: {owner[key]} and {gpu.name}"


def test_gpu_numbers_positive() -> None:
    for gpu in catalog.gpu_types().values():
        if gpu.is_cpu:
            assert gpu.memory_gb == 0  # shares host RAM
            continue
        assert gpu.memory_gb > 0, gpu.name
        assert gpu.fp32_tflops > 0, gpu.name
        assert gpu.fp16_tflops >= gpu.fp32_tflops, gpu.name
        assert gpu.mem_bw_gbps > 0, gpu.name
        assert gpu.nvml_match, f"{gpu.name} cannot be recognised from NVML"
        # a BF16 rate exactly when BF16 is supported
        assert (gpu.bf16_tflops > 0) == gpu.bf16, gpu.name


def test_only_cpu_is_cpu() -> None:
    assert [g.name for g in catalog.gpu_types().values() if g.is_cpu] == ["cpu"]


def test_memory_matches_the_name() -> None:
    types = catalog.gpu_types()
    assert types["A100-40GB"].memory_gb == 40
    assert types["A100-80GB"].memory_gb == 80
    assert types["H200"].memory_gb == 141


@pytest.mark.parametrize(("name", "bf16"), [("RTX3090", True), ("RTX4090", True), ("A100-80GB", True),
                                            ("H100-SXM", True), ("V100", False), ("T4", False)])
def test_bf16_flags(name: str, bf16: bool) -> None:
    assert catalog.gpu_types()[name].bf16 is bf16


def test_rtx3090_bf16_cites_the_whitepaper_over_the_seed() -> None:
    source = catalog.gpu_types()["RTX3090"].source
    assert "GA102" in source and "whitepaper" in source


def test_interconnect_names_exactly() -> None:
    assert tuple(catalog.interconnects()) == ("pcie", "nvlink", "nvswitch", "infiniband", "ethernet")


def test_interconnects_agree_with_spec_allocator_and_nccl_presets() -> None:
    names = set(catalog.interconnects())
    assert names == set(NETWORKS)
    network_field = ClusterSpec.model_fields["network"].annotation
    assert set(typing.get_args(typing.get_args(network_field)[0])) == set(NETWORKS)
    assert names == set(NCCL_BY_FABRIC)
    assert {n for n, ic in catalog.interconnects().items() if ic.scope == "inter-node"} == set(
        INTER_NODE_NETWORKS)
    assert {n for n, ic in catalog.interconnects().items() if ic.scope == "intra-node"} == set(FABRIC_LEVEL)
    assert set(FABRIC_LEVEL) == set(IN_NODE_NETWORKS)


def test_interconnect_numbers_positive() -> None:
    for ic in catalog.interconnects().values():
        assert ic.scope in ("intra-node", "inter-node"), ic.name
        assert ic.bw_gbps_per_direction > 0, ic.name
        assert ic.latency_us > 0, ic.name
        assert ic.max_gpus >= 2, ic.name


def test_interconnect_bandwidths_from_the_seeds() -> None:
    ics = catalog.interconnects()
    assert ics["nvlink"].bw_gbps_per_direction == 600 / 2  # 600 GB/s bidirectional
    assert ics["nvswitch"].bw_gbps_per_direction == 900 / 2
    assert ics["infiniband"].bw_gbps_per_direction == 400 / 8  # 400 Gbps NDR in GB/s
    assert ics["ethernet"].bw_gbps_per_direction == 100 / 8  # 100 GbE in GB/s


def test_prices_positive_and_known_kinds() -> None:
    for p in catalog.prices():
        assert p.usd_per_gpu_hour > 0, p
        assert p.kind in ("gpu", "cpu", "interconnect"), p
        if p.kind == "interconnect":
            assert p.item in catalog.interconnects(), p
        else:
            assert p.item in catalog.gpu_types(), p


def test_no_duplicate_price_rows() -> None:
    keys = [(p.book, p.item) for p in catalog.prices()]
    assert len(keys) == len(set(keys))


def test_price_books_in_file_order() -> None:
    assert catalog.price_books() == ("marketplace", "hyperscaler")


@pytest.mark.parametrize(
    ("book", "item", "usd"),
    [
        ("marketplace", "H100-SXM", 17.60 / 8),
        ("marketplace", "A100-80GB", 11.92 / 8),
        ("marketplace", "RTX4090", 17.28 / 96),  # 96 h for $17.28
        ("marketplace", "RTX3090", 0.15),
        ("marketplace", "nvlink", 0.10),
        ("marketplace", "nvswitch", 0.25),
        ("marketplace", "infiniband", 0.50),
        ("hyperscaler", "H100-SXM", 55.84 / 8),
    ],
)
def test_seed_prices(book: str, item: str, usd: float) -> None:
    price = catalog.price_of(book, item)
    assert price is not None
    assert price.usd_per_gpu_hour == pytest.approx(usd)


def test_marketplace_h100_is_2_20() -> None:
    price = catalog.price_of("marketplace", "H100-SXM")
    assert price is not None and price.usd_per_gpu_hour == pytest.approx(2.20)


def test_price_of_unknown_is_none() -> None:
    assert catalog.price_of("marketplace", "H200") is None
    assert catalog.price_of("nobook", "H100-SXM") is None


def test_resolve_gpu_unknown_raises_spec_error_on_given_field() -> None:
    with pytest.raises(SpecError) as info:
        catalog.resolve_gpu("a1000", field="cluster.gpu")
    [(field, msg)] = info.value.problems
    assert field == "cluster.gpu"
    assert "did you mean" in msg


@pytest.mark.parametrize(
    ("nvml", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA GeForce RTX 3090", "RTX3090"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Tesla T4", "T4"),
    ],
)
def test_gpu_from_nvml_name(nvml: str, expected: str) -> None:
    gpu = catalog.gpu_from_nvml_name(nvml)
    assert gpu is not None
    assert gpu.name == expected


@pytest.mark.parametrize("nvml", ["NVIDIA GeForce GTX 1080", "NVIDIA RTX A6000", "", "AMD Instinct MI300X"])
def test_gpu_from_unknown_nvml_name_is_none(nvml: str) -> None:
    assert catalog.gpu_from_nvml_name(nvml) is None


def test_every_nvml_pattern_maps_back_to_its_type() -> None:
    for gpu in catalog.gpu_types().values():
        for pattern in gpu.nvml_match:
            found = catalog.gpu_from_nvml_name(f"NVIDIA {pattern}")
            assert found is not None and found.name == gpu.name, (pattern, found)


def test_gh200_is_not_taken_for_h200() -> None:
    gpu = catalog.gpu_from_nvml_name("NVIDIA GH200 480GB")
    assert gpu is None or gpu.name != "H200"


def test_longest_nvml_pattern_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    # no two rows of today's data overlap, so pin the rule on a synthetic catalog, in both orders
    base = catalog.gpu_types()["RTX3090"]
    ti = dataclasses.replace(base, name="RTX3090Ti", nvml_match=("GeForce RTX 3090 Ti",))
    for order in ((base, ti), (ti, base)):
        monkeypatch.setattr(catalog, "gpu_types", lambda order=order: {g.name: g for g in order})
        found = catalog.gpu_from_nvml_name("NVIDIA GeForce RTX 3090 Ti")
        assert found is not None and found.name == "RTX3090Ti"
        found = catalog.gpu_from_nvml_name("NVIDIA GeForce RTX 3090")
        assert found is not None and found.name == "RTX3090"
