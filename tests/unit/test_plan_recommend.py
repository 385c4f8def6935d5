"""Ranking every cluster (gpufleet.plan.recommend): filters by memory, deadline and budget, the
order, the reasons for rejecting, the search space and its speed."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from gpufleet import catalog
from gpufleet.catalog import GpuType
from gpufleet.parallelism import resolve
from gpufleet.plan import recommend
from gpufleet.plan.estimate import Workload
from gpufleet.plan.models import Model, from_catalog


def _gpu(name: str) -> GpuType:
    return catalog.gpu_types()[name]


def _model(name: str) -> Model:
    return from_catalog(catalog.models()[name])


WORK8 = Workload(model=_model("llama3-8b"), seq=2048, samples=1_000_000)
# 1e6 samples x 2048 tokens of Llama 3 8B: about 8.8 h on 8 H100s (see test_plan_estimate), so a
# 24 h deadline leaves slower clusters out and a $2,000 budget the biggest ones.
DEADLINE_H = 24.0
BUDGET = 2000.0


@pytest.fixture(scope="module")
def both() -> recommend.Ranking:
    return recommend.rank(WORK8, deadline_h=DEADLINE_H, budget_usd=BUDGET)


@pytest.fixture(scope="module")
def budget_only() -> recommend.Ranking:
    return recommend.rank(WORK8, budget_usd=BUDGET)


def test_deadline_ranks_by_cost(both: recommend.Ranking) -> None:
    assert both.by == "cost"
    assert both.ranked
    costs = [p.cheapest_usd for p in both.ranked]
    assert all(c is not None for c in costs)
    assert costs == sorted(costs)  # type: ignore[type-var]


def test_deadline_ranked_plans_qualify(both: recommend.Ranking) -> None:
    for p in both.ranked:
        assert p.fits is True
        assert p.wall_time_h is not None and p.wall_time_h <= DEADLINE_H
        assert p.cheapest_usd is not None and p.cheapest_usd <= BUDGET


def test_deadline_only_ranks_by_cost() -> None:
    r = recommend.rank(WORK8, deadline_h=DEADLINE_H, gpus=[_gpu("H100-SXM")])
    assert r.by == "cost"
    costs = [p.cheapest_usd for p in r.ranked]
    assert costs == sorted(costs)  # type: ignore[type-var]
    assert all(p.wall_time_h is not None and p.wall_time_h <= DEADLINE_H for p in r.ranked)


def test_budget_only_ranks_by_time(budget_only: recommend.Ranking) -> None:
    assert budget_only.by == "time"
    assert budget_only.ranked
    hours = [p.wall_time_h for p in budget_only.ranked]
    assert all(h is not None for h in hours)
    assert hours == sorted(hours)  # type: ignore[type-var]


def test_budget_only_plans_within_budget(budget_only: recommend.Ranking) -> None:
    for p in budget_only.ranked:
        assert p.fits is True
        assert p.cheapest_usd is not None and p.cheapest_usd <= BUDGET


def test_considered_counts_every_candidate(both: recommend.Ranking) -> None:
    # planned ones are ranked or rejected on their numbers; GPU types that cannot run the
    # precision are rejected without a plan
    planned = [r for r in both.rejected if r.kind in ("memory", "deadline", "budget", "price")]
    assert both.considered == len(both.ranked) + len(planned)
    assert {r.gpu for r in both.rejected if r.kind == "precision"} == {"V100", "T4"}


def test_rejected_reasons(both: recommend.Ranking) -> None:
    kinds = Counter(r.kind for r in both.rejected)
    assert {"memory", "deadline", "budget"} <= set(kinds)
    for r in both.rejected:
        if r.kind == "memory":
            assert "GiB per GPU" in r.reason
        elif r.kind == "deadline":
            assert "deadline" in r.reason
            assert r.need > DEADLINE_H
        elif r.kind == "budget":
            assert "budget" in r.reason
            assert r.need > BUDGET
        elif r.kind == "precision":
            assert "no BF16 support" in r.reason
        else:
            assert r.kind == "price"
            assert "no price book" in r.reason


def test_why_not_one_line_per_gpu(both: recommend.Ranking) -> None:
    lines = recommend.why_not(both.rejected)
    gpus = list(dict.fromkeys(r.gpu for r in both.rejected))
    assert len(lines) == len(gpus)
    for gpu, line in zip(gpus, lines, strict=True):
        assert line.startswith(f"{gpu}: ")


def test_why_not_words() -> None:
    rows = [
        recommend.Rejected("H100-SXM", 1, "pcie", "ddp", "memory", "needs 90.0 GiB", 90.0),
        recommend.Rejected("H100-SXM", 2, "pcie", "ddp dp2", "memory", "needs 85.0 GiB", 85.0),
        recommend.Rejected("H100-SXM", 8, "nvswitch", "fsdp dp8", "deadline", "takes 30.0 h", 30.0),
        recommend.Rejected("A100-80GB", 8, "nvswitch", "fsdp dp8", "budget", "costs $3,000", 3000.0),
        recommend.Rejected("H200", 8, "nvswitch", "fsdp dp8", "price", "no price book offers H200", 0.0),
    ]
    lines = recommend.why_not(rows)
    assert len(lines) == 3
    # the closest memory miss is the smaller need: 2 x H100-SXM
    assert lines[0] == ("H100-SXM: 2 do not fit in memory (closest: 2 x H100-SXM ddp dp2, needs 85.0 GiB); "
                        "1 miss the deadline (closest: 8 x H100-SXM fsdp dp8, takes 30.0 h)")
    assert lines[1] == "A100-80GB: 1 are over budget (closest: 8 x A100-80GB fsdp dp8, costs $3,000)"
    assert lines[2] == "H200: no price book offers H200"
    assert recommend.why_not([]) == []


def test_nothing_fits_llama70b_on_one_gpu() -> None:
    work = Workload(model=_model("llama3-70b"), seq=2048, samples=1000)
    r = recommend.rank(work, deadline_h=1000, counts=[1])
    assert r.ranked == []
    assert r.rejected and all(x.kind in ("memory", "precision") for x in r.rejected)


# -- filters -------------------------------------------------------------------------------------


def test_filters_restrict_to_one_candidate() -> None:
    r = recommend.rank(WORK8, deadline_h=DEADLINE_H, gpus=[_gpu("H100-SXM")], counts=[8],
                       networks=["nvswitch"], strategies=["fsdp"])
    assert r.considered == 1
    [plan] = r.ranked
    assert (plan.gpu, plan.count, plan.network, plan.layout.strategy) == ("H100-SXM", 8, "nvswitch", "fsdp")
    assert (plan.layout.dp, plan.layout.tp, plan.layout.pp) == (8, 1, 1)


def test_filters_gpu_and_count() -> None:
    r = recommend.rank(WORK8, budget_usd=1e6, gpus=[_gpu("A100-80GB")], counts=[4, 8])
    plans = r.ranked + r.rejected
    assert plans
    assert {p.gpu for p in plans} == {"A100-80GB"}
    assert {p.count for p in plans} <= {4, 8}


def test_filters_network() -> None:
    r = recommend.rank(WORK8, budget_usd=1e6, networks=["pcie"])
    planned = [x for x in r.rejected if x.kind != "precision"]  # a whole GPU type has no network
    assert {p.network for p in r.ranked} | {x.network for x in planned} == {"pcie"}
    # PCIe cannot join nodes: nothing above 8 GPUs
    assert max(p.count for p in r.ranked) <= 8


def test_filters_strategy_tp() -> None:
    # "tp" alone: only FSDP with tensor parallelism inside a node, no pure data parallelism
    r = recommend.rank(WORK8, budget_usd=1e6, gpus=[_gpu("H100-SXM")], counts=[8], networks=["nvswitch"],
                       strategies=["tp"])
    assert r.considered == 3  # tp = 2, 4, 8
    assert sorted(p.layout.tp for p in r.ranked) == [2, 4, 8]
    assert all(p.layout.pp == 1 for p in r.ranked)


def test_filters_strategy_pp() -> None:
    r = recommend.rank(WORK8, budget_usd=1e6, gpus=[_gpu("H100-SXM")], counts=[32], networks=["infiniband"],
                       strategies=["pp"])
    # tp 8 over a node, pp 2 and 4 across nodes; microbatches 4 per stage
    assert sorted((p.layout.tp, p.layout.pp) for p in r.ranked) == [(8, 2), (8, 4)]
    assert all(p.layout.microbatches == 4 * p.layout.pp for p in r.ranked)


def test_no_bf16_gpus_skipped() -> None:
    # V100 and T4 have no BF16: a bf16 workload never considers them
    r = recommend.rank(WORK8, budget_usd=1e6, gpus=[_gpu("V100"), _gpu("T4")])
    assert r.considered == 0


def test_cpu_not_searched_by_default() -> None:
    r = recommend.rank(WORK8, budget_usd=1e6, counts=[1])
    assert "cpu" not in {p.gpu for p in r.ranked} | {x.gpu for x in r.rejected}


# -- search space -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "count", "expected"),
    [
        ("H100-SXM", 1, ["pcie"]),  # one GPU: no fabric to compare
        ("H100-SXM", 8, ["pcie", "nvswitch"]),
        ("H100-PCIe", 4, ["pcie", "nvlink"]),
        ("H100-PCIe", 8, ["pcie"]),  # NVLink bridges join at most 4
        ("RTX4090", 8, ["pcie"]),
        ("H100-SXM", 16, ["infiniband", "ethernet"]),
        ("RTX4090", 128, ["infiniband", "ethernet"]),
    ],
)
def test_networks_for(gpu: str, count: int, expected: list[str]) -> None:
    assert recommend.networks_for(_gpu(gpu), count) == expected


def test_layouts_for_eight() -> None:
    layouts = list(recommend.layouts_for(8, WORK8, None))
    keys = [(x.data_parallel, x.dp, x.tp, x.pp) for x in layouts]
    assert keys[:4] == [("ddp", 8, 1, 1), ("zero1", 8, 1, 1), ("zero2", 8, 1, 1), ("fsdp", 8, 1, 1)]
    assert ("fsdp", 4, 2, 1) in keys and ("fsdp", 1, 8, 1) in keys
    assert len(keys) == len(set(keys))


# -- speed -------------------------------------------------------------------------------------


def test_whole_catalog_for_llama3_70b_is_fast() -> None:
    # the requirement: ranking every cluster answers in under 2 s
    work = Workload(model=_model("llama3-70b"), seq=2048, samples=1_000_000)
    start = time.perf_counter()
    r = recommend.rank(work, deadline_h=24 * 7)
    elapsed = time.perf_counter() - start
    assert r.considered > 500
    assert r.ranked
    assert elapsed < 2.0, f"{elapsed:.2f} s for {r.considered} plans"


def test_every_empty_search_says_why() -> None:
    # a GPU without BF16, an impossible count, a strategy the model cannot take: no plan, a reason
    for kwargs, kind in (({"gpus": [_gpu("T4")]}, "precision"),
                         ({"gpus": [_gpu("H100-SXM")], "counts": [12], "networks": ["infiniband"]},
                          "cluster"),
                         ({"gpus": [_gpu("H100-SXM")], "counts": [8], "strategies": ["pp"]}, "layout")):
        r = recommend.rank(WORK8, budget_usd=1e6, **kwargs)  # type: ignore[arg-type]
        assert r.ranked == [] and {x.kind for x in r.rejected} == {kind}, kwargs
        assert recommend.why_not(r.rejected)


def test_short_layout_names_the_method_and_the_mesh() -> None:
    assert recommend.short_layout(resolve("fsdp", 8)) == "fsdp dp8"
    assert recommend.short_layout(resolve("fsdp", 16, tp=8)) == "fsdp dp2 tp8"
    assert recommend.short_layout(resolve("ddp", 1)) == "ddp"
    assert recommend.short_layout(resolve("fsdp", 16, tp=8, pp=2)) == "tp8 pp2"  # dp=1: no method


def test_one_gpu_plans_one_layout() -> None:
    # with one data-parallel rank DDP, ZeRO and FSDP are the same plan: planned once
    r = recommend.rank(WORK8, budget_usd=1e9, gpus=[_gpu("H100-SXM")], counts=[1])
    assert r.considered == 1
    assert [x.layout for x in r.rejected] + [recommend.short_layout(p.layout) for p in r.ranked] == ["ddp"]
