"""Compute time (gpufleet.plan.compute) and communication time (gpufleet.plan.comm) on
hand-computed cases."""

from __future__ import annotations

import pytest

from gpufleet.plan import comm, compute

N = 1_000_000
GB = 1e9

# -- FLOPs per token ----------------------------------------------------------------------------


def test_flops_full_training_6n() -> None:
    # 2N forward + 2N activation grads + 2N weight grads
    assert compute.flops_per_token(N, N) == 6 * N


def test_flops_full_recompute_8n() -> None:
    # the forward runs twice: 2 * 2N + 2N + 2N
    assert compute.flops_per_token(N, N, "full") == 8 * N


def test_flops_selective_counts_as_none() -> None:
    assert compute.flops_per_token(N, N, "selective") == 6 * N


def test_flops_lora_4n_plus_2t() -> None:
    # T = 1000 trainable: 2N + 2N + 2T
    assert compute.flops_per_token(N, 1000) == 4 * N + 2 * 1000


def test_attention_flops_12_l_h_s() -> None:
    # 12 x L x h x s = 12 x 2 x 4 x 8 = 768
    assert compute.attention_flops_per_token(2, 4, 8) == 768
    # Llama 3 8B at 2048 tokens: 12 x 32 x 4096 x 2048 = 3,221,225,472
    assert compute.attention_flops_per_token(32, 4096, 2048) == 3_221_225_472


def test_flops_with_attention() -> None:
    # attention A: a third in the forward, two thirds in the backward
    a = 3000.0
    assert compute.flops_per_token(N, N, attention=a) == pytest.approx(6 * N + a)
    # full recompute repeats the forward, A/3 included: 8N + 4A/3
    assert compute.flops_per_token(N, N, "full", a) == pytest.approx(8 * N + 4 * a / 3)
    # LoRA: 4N + 2T + A
    assert compute.flops_per_token(N, 1000, attention=a) == pytest.approx(4 * N + 2000 + a)


def test_model_flops_ignore_recompute() -> None:
    assert compute.model_flops_per_token(N, N) == 6 * N
    assert compute.model_flops_per_token(N, N, 3000.0) == pytest.approx(6 * N + 3000)


def test_compute_seconds() -> None:
    assert compute.compute_seconds(1e15, 5e14) == 2.0
    assert compute.compute_seconds(1e15, 0) == float("inf")


# -- pipeline bubble ---------------------------------------------------------------------------


def test_bubble_p4_m4() -> None:
    # (p - 1) / (m + p - 1) = 3 / 7
    assert compute.bubble_fraction(4, 4) == pytest.approx(3 / 7)


def test_bubble_p2_m8() -> None:
    # 1 / 9
    assert compute.bubble_fraction(2, 8) == pytest.approx(1 / 9)


def test_no_bubble_without_pipeline() -> None:
    assert compute.bubble_fraction(1, 4) == 0.0
    assert compute.bubble_fraction(1, 1) == 0.0


def test_with_bubble() -> None:
    # busy * (m + p - 1) / m = 10 * 7 / 4 = 17.5
    assert compute.with_bubble(10.0, 4, 4) == pytest.approx(17.5)
    assert compute.with_bubble(10.0, 1, 4) == 10.0


def test_mfu() -> None:
    # 4e14 useful FLOP/s over 2 devices of 1e15 peak = 0.2
    assert compute.mfu(4e14, 2, 1e15) == pytest.approx(0.2)
    assert compute.mfu(4e14, 2, 0) == 0.0


# -- ring collectives ---------------------------------------------------------------------------


def test_all_reduce_bandwidth_term() -> None:
    # 2 (n-1)/n S / B = 2 * 3/4 * 1e9 / 1e10 = 0.15 s
    assert comm.all_reduce_s(1e9, 4, 1e10) == pytest.approx(0.15)


def test_all_reduce_latency_term() -> None:
    # + 2 (n-1) alpha = 6 * 1e-5
    assert comm.all_reduce_s(1e9, 4, 1e10, 1e-5) == pytest.approx(0.15 + 6e-5)


def test_all_gather_and_reduce_scatter() -> None:
    # (n-1)/n S / B + (n-1) alpha = 3/4 * 1e9 / 1e10 + 3e-5 = 0.075 + 3e-5
    assert comm.all_gather_s(1e9, 4, 1e10, 1e-5) == pytest.approx(0.075 + 3e-5)
    assert comm.reduce_scatter_s(1e9, 4, 1e10, 1e-5) == pytest.approx(0.075 + 3e-5)


def test_two_ranks() -> None:
    # n=2: all-reduce 2 * 1/2 * S/B = S/B; all-gather S/(2B)
    assert comm.all_reduce_s(8e9, 2, 1e10) == pytest.approx(0.8)
    assert comm.all_gather_s(8e9, 2, 1e10) == pytest.approx(0.4)


@pytest.mark.parametrize("n", [0, 1])
def test_one_rank_costs_nothing(n: int) -> None:
    assert comm.all_reduce_s(1e9, n, 1e10, 1e-3) == 0.0
    assert comm.all_gather_s(1e9, n, 1e10, 1e-3) == 0.0


def test_p2p() -> None:
    assert comm.p2p_s(1e9, 1e10, 1e-5) == pytest.approx(0.1 + 1e-5)


# -- data parallelism -------------------------------------------------------------------------


def fixed(bw: float, lat: float = 0.0) -> comm.Link:
    return lambda op, size: (bw, lat)


@pytest.mark.parametrize("method", ["ddp", "zero1", "zero2"])
def test_ddp_like_is_one_all_reduce(method: str) -> None:
    # 1e9 params * 4 bytes all-reduced over 8 ranks
    got = comm.data_parallel_s(method, 1e9, 1e9, 4, 2, 8, fixed(1e11, 1e-6))
    assert got == comm.all_reduce_s(4e9, 8, 1e11, 1e-6)


def test_fsdp_equal_sizes_is_1_5x_ddp() -> None:
    # 2 all-gathers + 1 reduce-scatter = 3 (n-1)/n S / B = 1.5 x 2 (n-1)/n S / B (latency: 3 vs 2 too)
    ddp = comm.data_parallel_s("ddp", 1e9, 1e9, 2, 2, 8, fixed(1e11, 1e-6))
    for method in ("fsdp", "zero3"):
        assert comm.data_parallel_s(method, 1e9, 1e9, 2, 2, 8, fixed(1e11, 1e-6)) == pytest.approx(1.5 * ddp)


def test_fsdp_mixed_element_sizes() -> None:
    # fp32 grads reduce-scattered (4e9 bytes), bf16 weights gathered twice (2e9 bytes each), n=4, B=1e10:
    # 2 * 3/4 * 2e9/1e10 + 3/4 * 4e9/1e10 = 0.3 + 0.3 = 0.6 -- the same bytes as DDP's fp32 all-reduce
    assert comm.data_parallel_s("fsdp", 1e9, 1e9, 4, 2, 4, fixed(1e10)) == pytest.approx(0.6)
    assert comm.data_parallel_s("ddp", 1e9, 1e9, 4, 2, 4, fixed(1e10)) == pytest.approx(0.6)


def test_data_parallel_one_rank() -> None:
    assert comm.data_parallel_s("fsdp", 1e9, 1e9, 4, 2, 1, fixed(1e10, 1e-3)) == 0.0


def test_syncs_and_gathers_repeat_per_micro_batch() -> None:
    # DDP: 3 syncs -> 3 all-reduces. FSDP: weights gathered twice per micro-batch (4 micro-batches),
    # gradients reduce-scattered once per sync (1 here, a pipeline schedule): 2*4*0.15 + 1*0.3
    link = fixed(1e10)
    one = comm.data_parallel_s("ddp", 1e9, 1e9, 4, 2, 4, link)
    assert comm.data_parallel_s("ddp", 1e9, 1e9, 4, 2, 4, link, syncs=3) == pytest.approx(3 * one)
    got = comm.data_parallel_s("fsdp", 1e9, 1e9, 4, 2, 4, link, syncs=1, gathers=4)
    assert got == pytest.approx(2 * 4 * 0.15 + 0.3)


def test_lora_gathers_all_weights_but_reduces_only_adapters() -> None:
    # 1e6 trainable (fp32 grads, 4e6 bytes), 1e9 weights (bf16, 2e9 bytes), n=2, B=1e9
    got = comm.data_parallel_s("fsdp", 1e6, 1e9, 4, 2, 2, fixed(1e9))
    assert got == pytest.approx(2 * 0.5 * 2e9 / 1e9 + 0.5 * 4e6 / 1e9)


def test_link_is_asked_per_collective() -> None:
    asked: list[tuple[str, float]] = []

    def link(op: str, size: float) -> tuple[float, float]:
        asked.append((op, size))
        return 1e9, 0.0

    comm.data_parallel_s("fsdp", 10, 20, 4, 2, 2, link)
    assert asked == [("all_gather", 40), ("reduce_scatter", 40)]


# -- tensor and pipeline parallelism ------------------------------------------------------------


def test_tensor_parallel_four_all_reduces_per_layer() -> None:
    # size = s b h bytes = 4 * 5 * 6 * 2 = 240; tp=2: all-reduce 2 * 1/2 * 240 / B = 240 / B
    # layers 2 x micro-batches 3 x 4 all-reduces
    bw = 1e3
    one = comm.all_reduce_s(240, 2, bw)
    assert one == pytest.approx(0.24)
    got = comm.tensor_parallel_s(2, 3, 4, 5, 6, 2, 2, bw)
    assert got == pytest.approx(2 * 3 * 4 * one)


def test_tensor_parallel_full_recompute_six() -> None:
    bw = 1e3
    one = comm.all_reduce_s(240, 2, bw, 1e-6)
    got = comm.tensor_parallel_s(2, 3, 4, 5, 6, 2, 2, bw, 1e-6, recompute="full")
    assert got == pytest.approx(2 * 3 * 6 * one)


def test_tensor_parallel_tp1_free() -> None:
    assert comm.tensor_parallel_s(32, 4, 2048, 1, 4096, 1, 2, 1e11, 1e-6) == 0.0


def test_pipeline_s() -> None:
    # 2 m p2p of s b h bytes: m=4, size 4 * 5 * 6 * 2 = 240, B = 1e3, alpha = 1e-3
    # 2 * 4 * (0.24 + 0.001) = 1.928
    assert comm.pipeline_s(4, 4, 5, 6, 2, 2, 1e3, 1e-3) == pytest.approx(1.928)


def test_pipeline_one_stage_free() -> None:
    assert comm.pipeline_s(4, 4, 5, 6, 1, 2, 1e3, 1e-3) == 0.0


# -- overlap -----------------------------------------------------------------------------------


def test_exposed_fully_hidden() -> None:
    # overlap 1 and a window longer than the communication: nothing left but the fixed part
    assert comm.exposed_s(1.0, 10.0, 1.0) == 0.0
    assert comm.exposed_s(1.0, 10.0, 1.0, fixed=0.5) == 0.5


def test_exposed_partly() -> None:
    # window shorter: 2 - 0.8 * min(2, 1) = 1.2
    assert comm.exposed_s(2.0, 1.0, 0.8) == pytest.approx(1.2)
    # window longer, overlap 0.8: 2 - 0.8 * 2 = 0.4, + fixed 0.1
    assert comm.exposed_s(2.0, 5.0, 0.8, fixed=0.1) == pytest.approx(0.5)


def test_exposed_no_overlap() -> None:
    assert comm.exposed_s(2.0, 5.0, 0.0) == 2.0
    assert comm.exposed_s(2.0, 0.0, 0.8) == 2.0


# -- nccl-tests bus bandwidth -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "factor"),
    [("all_reduce", 1.5), ("all_gather", 0.75), ("reduce_scatter", 0.75), ("broadcast", 1.0)],
)
def test_algbw_to_busbw_n4(op: str, factor: float) -> None:
    # n=4: all-reduce 2 * 3/4, all-gather and reduce-scatter 3/4, broadcast 1
    assert comm.algbw_to_busbw(op, 10.0, 4) == pytest.approx(10.0 * factor)


def test_algbw_to_busbw_one_rank() -> None:
    assert comm.algbw_to_busbw("all_reduce", 10.0, 1) == 0.0


def test_algbw_to_busbw_unknown_op() -> None:
    with pytest.raises(KeyError):
        comm.algbw_to_busbw("all_to_all", 10.0, 4)
