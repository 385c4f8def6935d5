"""One plan (gpufleet.plan.estimate): the wiring of memory, compute, communication and cost, checked
against the pieces and against hand formulas from the catalog's numbers."""

from __future__ import annotations

import json
import math

import pytest

from gpufleet import catalog
from gpufleet.catalog import GpuType
from gpufleet.parallelism import Layout, resolve
from gpufleet.plan import cost
from gpufleet.plan.calibration import Calibration, CollectivePoint
from gpufleet.plan.estimate import Plan, Workload, cluster_problems, estimate, nodes_for
from gpufleet.plan.models import Model, from_catalog

GIB = 2**30
D = catalog.planner_defaults()


def _gpu(name: str) -> GpuType:
    return catalog.gpu_types()[name]


def _model(name: str) -> Model:
    return from_catalog(catalog.models()[name])


def _layout(strategy: str, count: int, precision: str = "bf16-mixed", **dims: int) -> Layout:
    return resolve(strategy, count, precision=precision, **dims)  # type: ignore[arg-type]


LLAMA8 = _model("llama3-8b")
LLAMA70 = _model("llama3-70b")
WORK8 = Workload(model=LLAMA8, seq=2048, samples=1_000_000)


def _h100x8(work: Workload = WORK8, calibration: Calibration | None = None) -> Plan:
    return estimate(work, _gpu("H100-SXM"), 8, "nvswitch", _layout("fsdp", 8), calibration)


# -- the plan's JSON ----------------------------------------------------------------------------


def test_to_dict_has_the_required_keys() -> None:
    d = _h100x8().to_dict()
    for key in ("fits", "memory_gib", "step_time_s", "compute_time_s", "comm_time_s", "samples_per_s",
                "tokens_per_s", "mfu", "scaling_efficiency", "wall_time_h", "cost_usd"):
        assert key in d, key
    assert {"weights", "gradients", "optimizer", "activations", "total"} <= set(d["memory_gib"])
    assert set(d["cost_usd"]) == {"marketplace", "hyperscaler"}
    assert d["fits"] is True
    json.dumps(d, allow_nan=False)  # plain JSON


def test_memory_gib_adds_up() -> None:
    plan = _h100x8()
    m = plan.to_dict()["memory_gib"]
    parts = m["weights"] + m["gradients"] + m["optimizer"] + m["activations"] + m["buffers"]
    assert m["total"] == pytest.approx(parts)
    assert m["capacity"] == pytest.approx(80 * (1 - D["memory_headroom"]))  # 76 GiB usable


def test_model_state_matches_fsdp_by_hand() -> None:
    # torch bf16 fsdp over 8: weights N * 4 / 8, gradients N * 4 / 8, optimizer N * 8 / 8
    plan = _h100x8()
    n = LLAMA8.params
    assert plan.weights == pytest.approx(n * 4 / 8)
    assert plan.gradients == pytest.approx(n * 4 / 8)
    assert plan.optimizer == pytest.approx(n * 8 / 8)


def test_step_time_is_compute_plus_exposed_comm() -> None:
    d = _h100x8().to_dict()
    assert d["step_time_s"] == pytest.approx(d["compute_time_s"] + d["comm_time_s"])
    assert d["comm_time_s"] <= d["comm_total_s"]


def test_samples_and_tokens_per_s() -> None:
    plan = _h100x8()
    d = plan.to_dict()
    # global batch = micro_batch 1 x 1 micro-batch x dp 8
    assert plan.global_batch == 8
    assert d["samples_per_s"] == pytest.approx(8 / d["step_time_s"])
    assert d["tokens_per_s"] == pytest.approx(d["samples_per_s"] * 2048)
    assert d["wall_time_h"] == pytest.approx(1_000_000 / d["samples_per_s"] / 3600)


def test_cost_is_rate_times_hours_per_book() -> None:
    plan = _h100x8()
    d = plan.to_dict()
    for book in ("marketplace", "hyperscaler"):
        rate = cost.cluster_rate("H100-SXM", 8, "nvswitch", book)
        assert rate is not None
        assert d["usd_per_hour"][book] == pytest.approx(rate.usd_per_hour)
        assert d["cost_usd"][book] == pytest.approx(rate.usd_per_hour * d["wall_time_h"])
    # marketplace 8 x (2.20 + 0.25 NVSwitch premium) = 19.60; hyperscaler p5.48xlarge 55.84
    assert d["usd_per_hour"] == pytest.approx({"marketplace": 19.6, "hyperscaler": 55.84})
    assert plan.cheapest_usd == pytest.approx(d["cost_usd"]["marketplace"])


def _fpt(model: Model, seq: int, trainable: int | None = None) -> float:
    """Training FLOPs per token by hand: 2N + 2N + 2T for the weights, plus the attention scores
    and weighted sum, 12 x L x h x s (PaLM appendix B)."""
    t = model.params if trainable is None else trainable
    return 4 * model.params + 2 * t + 12 * model.layers * model.hidden * seq


def test_compute_time_hand_formula() -> None:
    # tokens per device per step = 1 x 2048; 6N + 12 L h s FLOPs per token
    # (6 x 8,030,261,248 + 12 x 32 x 4096 x 2048 = 48,181,567,488 + 3,221,225,472);
    # at peak 989.4 TFLOPS x 0.45
    plan = _h100x8()
    assert _fpt(LLAMA8, 2048) == 48_181_567_488 + 3_221_225_472
    expected = 2048 * _fpt(LLAMA8, 2048) / (989.4e12 * D["compute_efficiency"])
    assert D["compute_efficiency"] == 0.45
    assert plan.compute_s == pytest.approx(expected)
    assert plan.device_tflops == pytest.approx(989.4 * 0.45)
    assert plan.peak_tflops == 989.4


def test_compute_time_with_grad_accum_and_micro_batch() -> None:
    work = Workload(model=LLAMA8, seq=1024, micro_batch=2, grad_accum=3, samples=1000)
    plan = _h100x8(work)
    expected = 2 * 1024 * 3 * _fpt(LLAMA8, 1024) / (989.4e12 * 0.45)
    assert plan.compute_s == pytest.approx(expected)
    assert plan.global_batch == 2 * 3 * 8


def test_compute_time_full_recompute_is_8n() -> None:
    base = _h100x8()
    full = _h100x8(Workload(model=LLAMA8, seq=2048, samples=1_000_000, recompute="full"))
    # the forward (2N + A/3) runs twice: 8N + 4A/3 against 6N + A, A = 12 L h s
    a = 12 * 32 * 4096 * 2048
    n = LLAMA8.params
    assert full.compute_s == pytest.approx(base.compute_s * (8 * n + 4 * a / 3) / (6 * n + a))


def test_mfu_is_efficiency_times_scaling() -> None:
    # MFU = (6N + A) x tokens/s / (count x peak) = 0.45 x compute / step = 0.45 x scaling efficiency
    plan = _h100x8()
    assert plan.mfu == pytest.approx(0.45 * plan.scaling_efficiency)
    assert 0 < plan.scaling_efficiency < 1


def test_one_gpu_has_no_comm_and_full_efficiency() -> None:
    work = Workload(model=_model("gpt2"), seq=1024, samples=1000)
    plan = estimate(work, _gpu("H100-SXM"), 1, "pcie", _layout("ddp", 1))
    assert plan.comm_total_s == 0.0
    assert plan.scaling_efficiency == pytest.approx(1.0)
    assert plan.mfu == pytest.approx(0.45)
    assert plan.nodes == 1


def test_lora_trainable_and_memory() -> None:
    work = Workload(model=LLAMA8, seq=2048, samples=1000, lora_rank=16)
    plan = _h100x8(work)
    assert work.trainable < LLAMA8.params
    assert plan.to_dict()["model"]["trainable"] == work.trainable
    # optimizer state only for the adapters: T x 8 / 8
    assert plan.optimizer == pytest.approx(work.trainable * 8 / 8)
    # 4N + 2T (+ attention) FLOPs per token
    expected = 2048 * _fpt(LLAMA8, 2048, work.trainable) / (989.4e12 * 0.45)
    assert plan.compute_s == pytest.approx(expected)


def test_exposed_comm_fsdp_by_hand() -> None:
    # FSDP over 8 H100s on NVSwitch: link 450 GB/s x 0.8 = 360 GB/s, latency 1 us
    # dp = 2 all-gathers of the bf16 weights (2N bytes) + a reduce-scatter of fp32 grads (4N bytes)
    # exposed = dp - 0.8 x min(dp, busy): FSDP overlaps with the whole step's compute
    plan = _h100x8()
    n, bw, lat = LLAMA8.params, 360e9, 1e-6
    gather = 7 / 8 * 2 * n / bw + 7 * lat
    scatter = 7 / 8 * 4 * n / bw + 7 * lat
    dp = 2 * gather + scatter
    assert plan.dp_comm_s == pytest.approx(dp)
    assert plan.comm_exposed_s == pytest.approx(dp - 0.8 * min(dp, plan.compute_s))


def test_exposed_comm_ddp_window() -> None:
    # gpufleet all-reduces after every micro-batch of an accumulation (2 here), each hidden
    # behind 2/3 of its micro-batch's compute: window = 2 x (compute / 2) x 2/3
    work = Workload(model=_model("gpt2"), seq=1024, samples=1000, grad_accum=2)
    plan = estimate(work, _gpu("H100-SXM"), 8, "nvswitch", _layout("ddp", 8))
    one = estimate(Workload(model=_model("gpt2"), seq=1024, samples=1000), _gpu("H100-SXM"), 8,
                   "nvswitch", _layout("ddp", 8))
    assert plan.dp_comm_s == pytest.approx(2 * one.dp_comm_s)
    window = plan.compute_s * 2 / 3
    assert plan.comm_exposed_s == pytest.approx(plan.dp_comm_s - 0.8 * min(plan.dp_comm_s, window))


def test_pipeline_bubble_stretches_compute() -> None:
    # 16 H100s, tp 8 x pp 2, m = 8 micro-batches: bubble 1 / 9
    layout = resolve("fsdp", 16, tp=8, pp=2, microbatches=8, precision="bf16-mixed")
    plan = estimate(WORK8, _gpu("H100-SXM"), 16, "infiniband", layout)
    assert plan.bubble == pytest.approx(1 / 9)
    busy = 8 * 2048 * _fpt(LLAMA8, 2048) / 16 / (989.4e12 * 0.45)
    assert plan.compute_s == pytest.approx(busy * 9 / 8)
    assert plan.pp_comm_s > 0
    assert plan.tp_comm_s > 0
    assert plan.global_batch == 8  # dp 1 x 8 micro-batches


# -- fitting -------------------------------------------------------------------------------------


def test_llama3_70b_does_not_fit_on_8_h100() -> None:
    # model state alone: 70.55e9 x 16 bytes / 8 = 141.1e9 bytes = 131 GiB > 80 GiB
    plan = estimate(Workload(model=LLAMA70, seq=2048, samples=1000), _gpu("H100-SXM"), 8, "nvswitch",
                    _layout("fsdp", 8))
    state = plan.weights + plan.gradients + plan.optimizer
    assert state == pytest.approx(LLAMA70.params * 16 / 8)
    assert state > 80 * GIB
    assert plan.fits is False


def test_llama3_70b_fits_on_64_h100_with_checkpointing() -> None:
    # model state 70.55e9 x 16 / 64 = 17.6e9 bytes = 16.4 GiB; activations with full recompute:
    # 80 layers x 2 s b h = 80 x 2 x 2048 x 8192 = 2.7e9 bytes + logits 4 x 2048 x 128256 = 1.05e9
    # + the layer being recomputed, whole: s b h x 34 (flash attention) = 0.57e9
    work = Workload(model=LLAMA70, seq=2048, samples=1000, recompute="full")
    plan = estimate(work, _gpu("H100-SXM"), 64, "infiniband", _layout("fsdp", 64))
    assert plan.weights + plan.gradients + plan.optimizer == pytest.approx(LLAMA70.params * 16 / 64)
    assert plan.activations == pytest.approx(80 * 2 * 2048 * 8192 + 4 * 2048 * 128256 + 34 * 2048 * 8192)
    assert plan.fits is True
    assert plan.nodes == 8


# -- links -----------------------------------------------------------------------------------


def test_a100_on_nvswitch_capped_by_its_nvlink() -> None:
    # min(NVSwitch 450, A100 NVLink 300) = 300 GB/s x 0.8 = 240
    plan = estimate(WORK8, _gpu("A100-80GB"), 8, "nvswitch", _layout("fsdp", 8))
    assert D["bandwidth_efficiency"] == 0.8
    assert plan.bandwidths_gbps["data_parallel"] == pytest.approx(240.0)


def test_h100_on_nvswitch_full_speed() -> None:
    assert _h100x8().bandwidths_gbps["data_parallel"] == pytest.approx(360.0)


def test_multi_node_dp_uses_infiniband() -> None:
    # 16 GPUs, dp 16: the group crosses nodes -> InfiniBand 50 GB/s x 0.8 = 40
    plan = estimate(WORK8, _gpu("H100-SXM"), 16, "infiniband", _layout("fsdp", 16))
    assert plan.nodes == 2
    assert plan.bandwidths_gbps["data_parallel"] == pytest.approx(40.0)
    # tensor parallel groups stay inside a node: the type's NVSwitch
    assert plan.bandwidths_gbps["tensor_parallel"] == pytest.approx(360.0)


def test_pcie_link() -> None:
    plan = estimate(WORK8, _gpu("H100-SXM"), 8, "pcie", _layout("fsdp", 8))
    assert plan.bandwidths_gbps["data_parallel"] == pytest.approx(32 * 0.8)


@pytest.mark.parametrize(("count", "nodes"), [(1, 1), (8, 1), (9, 2), (16, 2), (128, 16)])
def test_nodes_for(count: int, nodes: int) -> None:
    assert nodes_for(count) == nodes


def test_in_node_fabric_respects_its_size() -> None:
    # expected: the 8-GPU node of H100-PCIe cards talks over PCIe: 32 GB/s x 0.8 = 25.6
    assert cluster_problems(_gpu("H100-PCIe"), 8, "nvlink")  # the catalog's own rule
    layout = resolve("fsdp", 16, tp=8, precision="bf16-mixed")
    plan = estimate(WORK8, _gpu("H100-PCIe"), 16, "infiniband", layout)
    assert plan.bandwidths_gbps["tensor_parallel"] == pytest.approx(25.6)


# -- cluster problems ---------------------------------------------------------------------------


def _fields(gpu: str, count: int, network: str) -> list[str]:
    return [f for f, _ in cluster_problems(_gpu(gpu), count, network)]


def test_valid_clusters() -> None:
    assert cluster_problems(_gpu("H100-SXM"), 8, "nvswitch") == []
    assert cluster_problems(_gpu("H100-SXM"), 16, "infiniband") == []
    assert cluster_problems(_gpu("H100-PCIe"), 4, "nvlink") == []
    assert cluster_problems(_gpu("RTX4090"), 8, "pcie") == []


def test_twelve_gpus_not_a_multiple_of_eight() -> None:
    problems = cluster_problems(_gpu("H100-SXM"), 12, "infiniband")
    assert [f for f, _ in problems] == ["count"]
    assert "multiple of 8" in problems[0][1]


def test_sixteen_on_nvswitch() -> None:
    problems = cluster_problems(_gpu("H100-SXM"), 16, "nvswitch")
    assert [f for f, _ in problems] == ["network"]
    assert "infiniband" in problems[0][1]


def test_nvlink_with_eight() -> None:
    problems = cluster_problems(_gpu("A100-80GB"), 8, "nvlink")
    assert [f for f, _ in problems] == ["network"]
    assert "at most 4" in problems[0][1]


def test_nvlink_on_rtx4090() -> None:
    problems = cluster_problems(_gpu("RTX4090"), 2, "nvlink")
    assert [f for f, _ in problems] == ["network"]
    assert "no NVLink" in problems[0][1]


def test_unknown_network() -> None:
    problems = cluster_problems(_gpu("H100-SXM"), 8, "token-ring")
    assert [f for f, _ in problems] == ["network"]
    assert "unknown network" in problems[0][1]


def test_count_out_of_range() -> None:
    assert _fields("H100-SXM", 0, "infiniband") == ["count"]
    assert _fields("H100-SXM", 256, "infiniband") == ["count"]


# -- calibration -------------------------------------------------------------------------------


def test_calibration_for_another_gpu_ignored() -> None:
    cal = Calibration(gpu="A100-80GB", network="nvswitch", achieved_tflops=1.0,
                      collectives=(CollectivePoint("all_gather", 2**20, 1.0, 1.0, 1.0),))
    plan = _h100x8(calibration=cal)
    assert plan.device_tflops == pytest.approx(989.4 * 0.45)
    assert plan.bandwidths_gbps["data_parallel"] == pytest.approx(360.0)
    assert plan.calibrated == ()
    assert any("A100-80GB" in n and "H100-SXM" in n for n in plan.notes)


def test_calibration_replaces_compute_rate() -> None:
    cal = Calibration(gpu="H100-SXM", network="nvswitch", achieved_tflops=300.0, precision="bf16-mixed")
    plan = _h100x8(calibration=cal)
    assert plan.device_tflops == 300.0
    assert "compute" in plan.calibrated
    assert plan.compute_s == pytest.approx(2048 * _fpt(LLAMA8, 2048) / 300e12)
    assert plan.notes == ()


def test_calibration_precision_mismatch_noted() -> None:
    cal = Calibration(gpu="H100-SXM", network="nvswitch", achieved_tflops=300.0, precision="fp32")
    plan = _h100x8(calibration=cal)
    assert any("fp32" in n for n in plan.notes)


def test_calibration_replaces_dp_bandwidth() -> None:
    cal = Calibration(gpu="H100-SXM", network="nvswitch", collectives=(
        CollectivePoint("all_gather", 2**20, 1.0, 100.0, 100.0),
        CollectivePoint("reduce_scatter", 2**20, 1.0, 100.0, 100.0)))
    plan = _h100x8(calibration=cal)
    assert plan.bandwidths_gbps["data_parallel"] == pytest.approx(100.0)
    assert {"all_gather bandwidth", "reduce_scatter bandwidth"} <= set(plan.calibrated)
    # no latency term with a measured bus bandwidth
    n = LLAMA8.params
    assert plan.dp_comm_s == pytest.approx(2 * 7 / 8 * 2 * n / 100e9 + 7 / 8 * 4 * n / 100e9)


def test_calibration_cpu_compute() -> None:
    cal = Calibration(gpu="cpu", network="pcie", host_cpus=4, threads_per_worker=4, achieved_tflops=0.2)
    work = Workload(model=_model("gpt2"), seq=128, samples=100, precision="fp32")
    plan = estimate(work, _gpu("cpu"), 2, "pcie", _layout("ddp", 2, precision="fp32"), cal)
    # 2 workers on 4 cores get 2 threads each: 0.2 x 2 / 4 = 0.1 TFLOPS
    assert plan.device_tflops == pytest.approx(0.1)
    assert plan.capacity is None
    assert plan.fits is None
    assert plan.mfu is None  # no rated peak


def test_uncalibrated_cpu_plan_has_finite_efficiency() -> None:
    work = Workload(model=_model("gpt2"), seq=1024, samples=100)
    plan = estimate(work, _gpu("cpu"), 1, "pcie", _layout("ddp", 1))
    assert any("no rated peak" in n for n in plan.notes)
    assert not math.isnan(plan.scaling_efficiency)


def test_calibration_over_another_network_keeps_catalog_bandwidth() -> None:
    cal = Calibration(gpu="H100-SXM", network="pcie", collectives=(
        CollectivePoint("all_gather", 2**20, 1.0, 100.0, 100.0),
        CollectivePoint("reduce_scatter", 2**20, 1.0, 100.0, 100.0)))
    plan = _h100x8(calibration=cal)
    assert plan.bandwidths_gbps["data_parallel"] == pytest.approx(450 * 0.8)
    assert any("over pcie, not nvswitch" in n for n in plan.notes)
