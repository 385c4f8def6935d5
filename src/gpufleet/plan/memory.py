"""Memory per GPU: model state (weights, gradients, optimizer), activations and buffers.

Every function is pure and small so a test can pin it on a hand-computed case; the formulas and
their sources are in docs/planning.md. Sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.parallelism import SHARDED


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter, or per rank, of the three kinds of model state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def state_bytes_per_param(precision: str, framework: str) -> StateBytes:
    """Bytes each trainable parameter costs with Adam.

    DeepSpeed in mixed precision keeps 16-bit weights and gradients and, in the optimizer, an
    fp32 master copy with Adam's two moments: 2 + 2 + 12 = 16 bytes (ZeRO paper, Rajbhandari et
    al. 2020, section 3.1, K = 12). PyTorch's own mixed precision (autocast, FSDP's
    MixedPrecisionPolicy) keeps the fp32 weights as the parameters and casts on the fly, so the
    same 16 bytes split 4 + 4 + 8. In fp32 both are 4 + 4 + 8.
    """
    if framework == "deepspeed" and precision != "fp32":
        return StateBytes(2, 2, 12)
    return StateBytes(4, 4, 8)


def frozen_bytes_per_param(precision: str) -> int:
    """A frozen (LoRA base) weight is held in the compute dtype: 2 bytes in mixed precision."""
    return 4 if precision == "fp32" else 2


def model_state(params: int, trainable: int, *, data_parallel: str, dp: int, tp: int, pp: int,
                precision: str, framework: str, adapters: bool = False) -> StateBytes:
    """Model-state bytes on one rank.

    Tensor and pipeline parallelism split the model tp x pp ways. The data-parallel method then
    splits what it shards dp ways (ZeRO stage 1: optimizer; 2: + gradients; 3 and FSDP: +
    weights; ZeRO paper section 5). With `adapters` (LoRA) the `trainable` parameters are added
    on top of the `params` of the frozen base, which have no gradients or optimizer state;
    otherwise the first `trainable` of the `params` train and the rest are frozen.
    """
    per = state_bytes_per_param(precision, framework)
    sharded = SHARDED[data_parallel]
    split = tp * pp

    def share(total: float, kind: str) -> float:
        return total / split / (dp if kind in sharded else 1)

    frozen = params if adapters else params - trainable
    return StateBytes(
        weights=share(trainable * per.weights + frozen * frozen_bytes_per_param(precision), "parameters"),
        gradients=share(trainable * per.gradients, "gradients"),
        optimizer=share(trainable * per.optimizer, "optimizer"),
    )


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, *, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               attention: str = "flash", element_bytes: int = 2) -> float:
    """Activations one transformer layer keeps for its backward pass, per micro-batch.

    Korthikanti et al. 2022 (Reducing Activation Recomputation in Large Transformer Models),
    section 4, for 16-bit activations: s*b*h*(34 + 5*a*s/h) without parallelism; with tensor
    parallelism s*b*h*(10 + 24/t + 5*a*s/(h*t)); adding sequence parallelism s*b*h*(34/t +
    5*a*s/(h*t)); full recomputation keeps only the layer's input, 2*s*b*h (/t with sequence
    parallelism). The 5*a*s/h term is the attention matrix (scores, softmax, dropout): fused
    attention (FlashAttention, PyTorch's SDPA) never stores it, and selective recomputation
    recomputes it, so `attention="flash"` and `recompute="selective"` both drop it. fp32
    activations (`element_bytes=4`) double the 16-bit terms.
    """
    s, b, h, a, t = seq, micro_batch, hidden, heads, tp
    scale = element_bytes / 2
    if recompute == "full":
        return 2 * s * b * h * scale / (t if sequence_parallel else 1)
    attention_matrix = 0.0 if attention == "flash" or recompute == "selective" else 5 * a * s / (h * t)
    linear_part = 34 / t if sequence_parallel else 10 + 24 / t
    return s * b * h * (linear_part + attention_matrix) * scale


def logits_bytes(seq: int, micro_batch: int, vocab: int, tp: int = 1) -> float:
    """The output layer's logits kept in fp32 for the cross-entropy loss, 4*s*b*v bytes, split
    over tensor-parallel ranks by a vocabulary-parallel head (Korthikanti et al. 2022 count this
    output-layer term beside their eq. 5). At a 128K vocabulary it rivals a whole layer."""
    return 4 * seq * micro_batch * vocab / tp


def in_flight_microbatches(pp: int, microbatches: int, schedule: str) -> int:
    """Micro-batches whose activations the first pipeline stage holds at once: GPipe runs every
    forward before any backward (all m); 1F1B starts backwards after p forwards (min(p, m))
    (Narayanan et al. 2021, section 2.2)."""
    if pp == 1:
        return 1
    return microbatches if schedule == "gpipe" else min(pp, microbatches)


def activations(layers: int, per_layer: float, logits: float, *, pp: int, microbatches: int,
                schedule: str, working_layer: float = 0.0) -> float:
    """Peak activation bytes on the busiest pipeline stage: the first holds its layers for every
    micro-batch in flight; the last holds its layers for one (1F1B) plus the logits.
    `working_layer` is held on top: with full recomputation, the one layer being recomputed
    keeps all its activations until its backward is done."""
    if pp == 1:
        return layers * per_layer + logits + working_layer
    stage_layers = layers / pp
    first = stage_layers * per_layer * in_flight_microbatches(pp, microbatches, schedule)
    held_last = microbatches if schedule == "gpipe" else 1
    last = (stage_layers * per_layer + logits) * held_last
    return max(first, last) + working_layer


def buffers(*, data_parallel: str, framework: str, grads_bytes: float, layer_params: float,
            tp: int, compute_bytes: int, reserve_bytes: float) -> float:
    """Communication buffers and the runtime's own reserve.

    PyTorch DDP copies gradients into its buckets (`gradient_as_bucket_view=False`, the
    default), so DDP and ZeRO-1 on top of it hold a second copy of the gradients. Sharded
    methods gather one layer's full weights and prefetch the next (FSDP's default), and reduce
    one layer's gradients: about 3 layers' worth in the compute dtype. DeepSpeed's ZeRO-1/2
    use fixed reduce/all-gather buckets of 5e8 elements each (its default `reduce_bucket_size`
    and `allgather_bucket_size`). `reserve_bytes` is the CUDA context and workspaces.
    """
    layer = layer_params / tp * compute_bytes
    if framework == "deepspeed" and data_parallel in ("zero1", "zero2"):
        comm = min(grads_bytes, 2 * 5e8 * compute_bytes)
    elif data_parallel in ("ddp", "zero1"):
        comm = grads_bytes
    else:
        comm = 3 * layer
    return comm + reserve_bytes
