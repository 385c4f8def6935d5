"""Compute time per step: FLOPs from the parameter count, over the GPUs' sustained rate.

Pure functions; formulas and sources in docs/planning.md.
"""

from __future__ import annotations


def attention_flops_per_token(layers: int, hidden: int, seq: int) -> float:
    """The attention scores and their weighted sum, which have no parameters: 2 x 2 x s x h
    FLOPs per token per layer forward, three times that with backward, 12 x L x h x s in all
    (PaLM, Chowdhery et al. 2022, appendix B; torchtitan and Megatron count it too). At Llama 3
    8B's 8192 tokens it adds a quarter to 6N."""
    return 12 * layers * hidden * seq


def flops_per_token(params: int, trainable: int, recompute: str = "none",
                    attention: float = 0.0) -> float:
    """Training FLOPs per token: 2N forward, 2N for the activation gradients and 2T for the
    weight gradients of the T trainable parameters, plus `attention` (see above). Full training
    (T = N) gives the usual 6N (Kaplan et al. 2020, section 2.1; Narayanan et al. 2021,
    appendix); full recomputation runs the forward again, 8N (Korthikanti et al. 2022, section
    5). LoRA's frozen weights need no weight gradients: about 4N."""
    forward = 2 * params + attention / 3
    backward = 2 * params + 2 * trainable + attention * 2 / 3
    return forward * (2 if recompute == "full" else 1) + backward


def model_flops_per_token(params: int, trainable: int, attention: float = 0.0) -> float:
    """The useful FLOPs that MFU counts: recomputation is work done twice, not model work
    (PaLM, Chowdhery et al. 2022, appendix B)."""
    return flops_per_token(params, trainable, "none", attention)


def compute_seconds(flops: float, flops_per_s: float) -> float:
    """Time for `flops` on one device sustaining `flops_per_s`."""
    return flops / flops_per_s if flops_per_s > 0 else float("inf")


def bubble_fraction(pp: int, microbatches: int) -> float:
    """Idle share of a pipeline step, (p - 1) / (m + p - 1) for GPipe and 1F1B alike
    (Narayanan et al. 2021, section 2.2.1)."""
    return (pp - 1) / (microbatches + pp - 1) if pp > 1 else 0.0


def with_bubble(seconds: float, pp: int, microbatches: int) -> float:
    """Compute time stretched by the bubble: busy time / (1 - bubble) = busy x (m + p - 1) / m."""
    return seconds / (1 - bubble_fraction(pp, microbatches))


def mfu(model_flops_per_s: float, devices: int, peak_flops_per_s: float) -> float:
    """Model FLOPs utilization: useful FLOPs per second over the cluster's dense peak."""
    total = devices * peak_flops_per_s
    return model_flops_per_s / total if total > 0 else 0.0
