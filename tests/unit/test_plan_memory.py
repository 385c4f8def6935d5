"""Memory per GPU (gpufleet.plan.memory): model state per the ZeRO paper, activations per
Korthikanti et al. 2022, logits, pipeline in-flight micro-batches and buffers."""

from __future__ import annotations

import pytest

from gpufleet.plan.memory import (
    StateBytes,
    activation_bytes_per_layer,
    activations,
    buffers,
    frozen_bytes_per_param,
    in_flight_microbatches,
    logits_bytes,
    model_state,
    state_bytes_per_param,
)

# -- bytes per parameter ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "framework", "expected"),
    [
        ("bf16-mixed", "deepspeed", (2, 2, 12)),  # ZeRO paper: 16-bit weights and grads, K = 12
        ("fp16-mixed", "deepspeed", (2, 2, 12)),
        ("bf16-mixed", "torchrun", (4, 4, 8)),  # PyTorch AMP keeps fp32 params and grads
        ("fp16-mixed", "accelerate", (4, 4, 8)),
        ("fp32", "torchrun", (4, 4, 8)),
        ("fp32", "deepspeed", (4, 4, 8)),
    ],
)
def test_state_bytes_per_param(precision: str, framework: str, expected: tuple[int, int, int]) -> None:
    s = state_bytes_per_param(precision, framework)
    assert (s.weights, s.gradients, s.optimizer) == expected
    assert s.total == 16  # Adam costs 16 bytes per trainable parameter in every case


def test_frozen_bytes() -> None:
    assert frozen_bytes_per_param("bf16-mixed") == 2
    assert frozen_bytes_per_param("fp16-mixed") == 2
    assert frozen_bytes_per_param("fp32") == 4


# -- ZeRO paper, Figure 1: psi = 7.5e9, N_d = 64, K = 12 ----------------------------------------

PSI = 7_500_000_000


def _zero(data_parallel: str) -> StateBytes:
    return model_state(PSI, PSI, data_parallel=data_parallel, dp=64, tp=1, pp=1,
                       precision="bf16-mixed", framework="deepspeed")


def test_zero_baseline_ddp() -> None:
    # (2 + 2 + K) * psi = 16 * 7.5e9 = 120e9 bytes ("120 GB")
    s = _zero("ddp")
    assert s.total == 120e9
    assert (s.weights, s.gradients, s.optimizer) == (15e9, 15e9, 90e9)


def test_zero_stage1() -> None:
    # 2 psi + 2 psi + K psi / N_d = 15e9 + 15e9 + 90e9/64 = 31.40625e9 ("31.4 GB")
    s = _zero("zero1")
    assert s.total == pytest.approx(31.40625e9)
    assert round(s.total / 1e9, 1) == 31.4


def test_zero_stage2() -> None:
    # 2 psi + (2 + K) psi / N_d = 15e9 + 105e9/64 = 16.640625e9 ("16.6 GB")
    s = _zero("zero2")
    assert s.total == pytest.approx(16.640625e9)
    assert round(s.total / 1e9, 1) == 16.6


@pytest.mark.parametrize("method", ["zero3", "fsdp"])
def test_zero_stage3_and_fsdp(method: str) -> None:
    # (2 + 2 + K) psi / N_d = 120e9 / 64 = 1.875e9 ("1.9 GB")
    s = _zero(method)
    assert s.total == pytest.approx(1.875e9)
    assert round(s.total / 1e9, 1) == 1.9
    assert s.weights == pytest.approx(15e9 / 64)


def test_tp_pp_split_the_model() -> None:
    # ddp with tp=2, pp=2: every state split 4 ways and none dp ways: 120e9 / 4 = 30e9
    s = model_state(PSI, PSI, data_parallel="ddp", dp=4, tp=2, pp=2, precision="bf16-mixed",
                    framework="deepspeed")
    assert s.total == pytest.approx(30e9)
    # fsdp on top: also dp ways, 120e9 / (2 * 2 * 4) = 7.5e9
    s = model_state(PSI, PSI, data_parallel="fsdp", dp=4, tp=2, pp=2, precision="bf16-mixed",
                    framework="deepspeed")
    assert s.total == pytest.approx(7.5e9)


def test_torch_mixed_split() -> None:
    # 1000 params, ddp, torch: 4000 + 4000 + 8000
    s = model_state(1000, 1000, data_parallel="ddp", dp=2, tp=1, pp=1, precision="bf16-mixed",
                    framework="torchrun")
    assert (s.weights, s.gradients, s.optimizer) == (4000, 4000, 8000)


def test_lora_frozen_weights_torch() -> None:
    # 1000 params of which 10 trainable, torch bf16, ddp:
    # weights 10 * 4 + 990 * 2 = 2020; gradients 10 * 4 = 40; optimizer 10 * 8 = 80
    s = model_state(1000, 10, data_parallel="ddp", dp=1, tp=1, pp=1, precision="bf16-mixed",
                    framework="torchrun")
    assert (s.weights, s.gradients, s.optimizer) == (2020, 40, 80)


def test_lora_frozen_weights_deepspeed_fsdp() -> None:
    # deepspeed bf16: weights 10 * 2 + 990 * 2 = 2000, grads 20, optimizer 120; zero3 dp=4 -> / 4
    s = model_state(1000, 10, data_parallel="zero3", dp=4, tp=1, pp=1, precision="bf16-mixed",
                    framework="deepspeed")
    assert (s.weights, s.gradients, s.optimizer) == (500, 5, 30)


def test_lora_frozen_weights_fp32() -> None:
    # fp32: frozen weights 4 bytes: 10 * 4 + 990 * 4 = 4000
    s = model_state(1000, 10, data_parallel="ddp", dp=1, tp=1, pp=1, precision="fp32",
                    framework="torchrun")
    assert (s.weights, s.gradients, s.optimizer) == (4000, 40, 80)


# -- activations per layer: Korthikanti et al. 2022, s=2048, b=1, h=12288, a=96 ---------------

S, B, H, A = 2048, 1, 12288, 96
SBH = S * B * H  # 25,165,824
# 5 a s / h = 5 * 96 * 2048 / 12288 = 80


def test_sbh_and_attention_term() -> None:
    assert SBH == 25_165_824
    assert 5 * A * S / H == 80


def test_no_parallelism_eager() -> None:
    # s b h (34 + 5 a s / h) = SBH * 114 = 2,868,903,936 bytes
    got = activation_bytes_per_layer(S, B, H, A, attention="eager")
    assert got == SBH * 114 == 2_868_903_936


def test_tp8_without_sp_eager() -> None:
    # s b h (10 + 24/t + 5 a s / (h t)) = SBH (10 + 3 + 10) = 23 SBH = 578,813,952
    got = activation_bytes_per_layer(S, B, H, A, tp=8, attention="eager")
    assert got == pytest.approx(23 * SBH)
    assert got == pytest.approx(578_813_952)


def test_tp8_with_sp_eager() -> None:
    # s b h (34/t + 5 a s / (h t)) = SBH (4.25 + 10) = 14.25 SBH = 358,612,992
    got = activation_bytes_per_layer(S, B, H, A, tp=8, sequence_parallel=True, attention="eager")
    assert got == pytest.approx(14.25 * SBH)
    assert got == pytest.approx(358_612_992)


def test_selective_recompute() -> None:
    # selective drops the attention term: no parallel 34 SBH; tp=8 10 + 3 = 13 SBH; tp=8 + sp 34/8
    assert activation_bytes_per_layer(S, B, H, A, recompute="selective", attention="eager") == 34 * SBH
    assert activation_bytes_per_layer(S, B, H, A, tp=8, recompute="selective",
                                      attention="eager") == pytest.approx(13 * SBH)
    assert activation_bytes_per_layer(S, B, H, A, tp=8, sequence_parallel=True, recompute="selective",
                                      attention="eager") == pytest.approx(4.25 * SBH)


def test_full_recompute() -> None:
    # only the layer input: 2 s b h = 50,331,648 bytes; tp without sp does not split it
    assert activation_bytes_per_layer(S, B, H, A, recompute="full") == 2 * SBH == 50_331_648
    assert activation_bytes_per_layer(S, B, H, A, tp=8, recompute="full") == 2 * SBH
    # with sequence parallelism each rank keeps 1/t of it: 2 SBH / 8 = 6,291,456
    assert activation_bytes_per_layer(S, B, H, A, tp=8, sequence_parallel=True,
                                      recompute="full") == 2 * SBH / 8 == 6_291_456


def test_flash_drops_the_attention_matrix() -> None:
    # flash (the default): 34 SBH; tp=8: 13 SBH; tp=8 + sp: 4.25 SBH
    assert activation_bytes_per_layer(S, B, H, A) == 34 * SBH
    assert activation_bytes_per_layer(S, B, H, A, tp=8) == pytest.approx(13 * SBH)
    assert activation_bytes_per_layer(S, B, H, A, tp=8, sequence_parallel=True) == pytest.approx(4.25 * SBH)


def test_fp32_doubles() -> None:
    # eager, fp32: 2 * 114 SBH; full recompute 2 * 2 SBH
    assert activation_bytes_per_layer(S, B, H, A, attention="eager", element_bytes=4) == 228 * SBH
    assert activation_bytes_per_layer(S, B, H, A, recompute="full", element_bytes=4) == 4 * SBH


def test_micro_batch_is_linear() -> None:
    assert activation_bytes_per_layer(S, 4, H, A, attention="eager") == 4 * 114 * SBH


# -- logits -------------------------------------------------------------------------------------


def test_logits_bytes() -> None:
    # 4 s b v / t = 4 * 2048 * 2 * 128256 / 4 = 525,336,576
    assert logits_bytes(2048, 2, 128256, 4) == 525_336_576
    assert logits_bytes(2048, 1, 50257) == 4 * 2048 * 50257


# -- pipeline ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pp", "m", "schedule", "expected"),
    [
        (1, 8, "1f1b", 1),  # no pipeline: one micro-batch at a time
        (1, 8, "gpipe", 1),
        (4, 16, "1f1b", 4),  # min(p, m)
        (4, 2, "1f1b", 2),
        (4, 16, "gpipe", 16),  # all m
    ],
)
def test_in_flight(pp: int, m: int, schedule: str, expected: int) -> None:
    assert in_flight_microbatches(pp, m, schedule) == expected


def test_activations_no_pipeline() -> None:
    # layers * per_layer + logits = 8 * 100 + 1000
    assert activations(8, 100, 1000, pp=1, microbatches=8, schedule="1f1b") == 1800


def test_activations_pipeline_last_stage_busiest() -> None:
    # pp=4, 8 layers -> 2 per stage, m=8, 1f1b:
    # first: 2 * 100 * min(4, 8) = 800; last: (2 * 100 + 1000) * 1 = 1200 -> 1200
    assert activations(8, 100, 1000, pp=4, microbatches=8, schedule="1f1b") == 1200


def test_activations_pipeline_first_stage_busiest() -> None:
    # small logits: first 800; last 200 + 10 = 210 -> 800
    assert activations(8, 100, 10, pp=4, microbatches=8, schedule="1f1b") == 800


def test_activations_gpipe() -> None:
    # gpipe holds all m=8: first 2 * 100 * 8 = 1600; last (200 + 10) * 8 = 1680
    assert activations(8, 100, 10, pp=4, microbatches=8, schedule="gpipe") == 1680


# -- buffers ----------------------------------------------------------------------------------


def test_buffers_ddp_copies_gradients() -> None:
    # DDP: gradient bucket copy + reserve = 4e9 + 1e9
    got = buffers(data_parallel="ddp", framework="torchrun", grads_bytes=4e9, layer_params=1e8, tp=1,
                  compute_bytes=2, reserve_bytes=1e9)
    assert got == 5e9


def test_buffers_torch_zero1_copies_gradients() -> None:
    got = buffers(data_parallel="zero1", framework="torchrun", grads_bytes=4e9, layer_params=1e8, tp=1,
                  compute_bytes=2, reserve_bytes=0)
    assert got == 4e9


def test_buffers_fsdp_three_layers() -> None:
    # 3 layers in the compute dtype, split tp ways: 3 * 1e8 / 2 * 2 = 3e8, + reserve 1e9
    got = buffers(data_parallel="fsdp", framework="torchrun", grads_bytes=4e9, layer_params=1e8, tp=2,
                  compute_bytes=2, reserve_bytes=1e9)
    assert got == pytest.approx(1.3e9)


def test_buffers_deepspeed_zero2_buckets() -> None:
    # min(grads, 2 * 5e8 * 2 bytes = 2e9): large gradients are capped at 2e9 ...
    big = buffers(data_parallel="zero2", framework="deepspeed", grads_bytes=4e9, layer_params=1e8, tp=1,
                  compute_bytes=2, reserve_bytes=0)
    assert big == 2e9
    # ... small ones are not
    small = buffers(data_parallel="zero2", framework="deepspeed", grads_bytes=1e9, layer_params=1e8, tp=1,
                    compute_bytes=2, reserve_bytes=0)
    assert small == 1e9


def test_buffers_deepspeed_zero3_gathers_layers() -> None:
    # stage 3 gathers layers like FSDP: 3 * 1e8 * 2 = 6e8
    got = buffers(data_parallel="zero3", framework="deepspeed", grads_bytes=4e9, layer_params=1e8, tp=1,
                  compute_bytes=2, reserve_bytes=0)
    assert got == pytest.approx(6e8)
