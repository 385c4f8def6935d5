"""Communication time per step, from ring collective costs over the group's link bandwidth.

Pure functions; formulas and sources in docs/planning.md. Sizes are bytes, bandwidths bytes/s
(one direction, per GPU), latencies seconds.
"""

from __future__ import annotations

from collections.abc import Callable


def all_reduce_s(size: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """Ring all-reduce: each GPU sends and receives 2(n-1)/n x S over 2(n-1) steps (Patarasuk
    and Yuan 2009; nccl-tests' PERFORMANCE.md uses the same factor for bus bandwidth)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency


def all_gather_s(size: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """Ring all-gather of an S-byte result (or reduce-scatter of an S-byte input): (n-1)/n x S."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * size / bandwidth + (n - 1) * latency


reduce_scatter_s = all_gather_s


def p2p_s(size: float, bandwidth: float, latency: float = 0.0) -> float:
    return size / bandwidth + latency


Link = Callable[[str, float], tuple[float, float]]  # (op, bytes) -> (bytes/s, latency s)


def data_parallel_s(data_parallel: str, grad_elems: float, weight_elems: float, grad_bytes: int,
                    gather_bytes: int, dp: int, link: Link, syncs: int = 1, gathers: int = 1) -> float:
    """Per-step data-parallel traffic of this rank's tp/pp slice: `grad_elems` trainable and
    `weight_elems` total parameters. DDP all-reduces gradients; ZeRO-1/2 reduce-scatter gradients
    and all-gather updated weights, the same volume (ZeRO paper section 7.2.1); ZeRO-3 and FSDP
    also all-gather the weights before backward, 1.5x DDP's volume at equal element sizes (ibid.
    7.2.2; with PyTorch's fp32 gradient reduce and bf16 weight gathers the bytes come out equal
    to DDP's fp32 all-reduce). Gradients are reduced `syncs` times per step (once per
    micro-batch when accumulation does not skip the sync) and sharded weights gathered `gathers`
    times (once per micro-batch). `link(op, size)` gives each collective's bandwidth and
    latency, so a calibration can supply measured ones."""
    grads = grad_elems * grad_bytes
    if data_parallel in ("ddp", "zero1", "zero2"):
        return syncs * all_reduce_s(grads, dp, *link("all_reduce", grads))
    weights = weight_elems * gather_bytes
    return (2 * gathers * all_gather_s(weights, dp, *link("all_gather", weights))
            + syncs * reduce_scatter_s(grads, dp, *link("reduce_scatter", grads)))


def tensor_parallel_s(layers: float, microbatches: int, seq: int, micro_batch: int, hidden: int,
                      tp: int, element_bytes: int, bandwidth: float, latency: float = 0.0,
                      recompute: str = "none") -> float:
    """Megatron tensor parallelism all-reduces the b x s x h activations twice per layer forward
    and twice backward (Shoeybi et al. 2019, section 3; with sequence parallelism the same volume
    moves as all-gather + reduce-scatter, Korthikanti et al. 2022, section 4.2.2). Full
    recomputation repeats the forward's two."""
    per_layer = 6 if recompute == "full" else 4
    size = seq * micro_batch * hidden * element_bytes
    return layers * microbatches * per_layer * all_reduce_s(size, tp, bandwidth, latency)


def pipeline_s(microbatches: int, seq: int, micro_batch: int, hidden: int, pp: int,
               element_bytes: int, bandwidth: float, latency: float = 0.0) -> float:
    """Each stage boundary passes every micro-batch's b x s x h activations forward and their
    gradients back; counted once on the critical path."""
    if pp <= 1:
        return 0.0
    return 2 * microbatches * p2p_s(seq * micro_batch * hidden * element_bytes, bandwidth, latency)


def exposed_s(overlappable: float, window: float, overlap: float, fixed: float = 0.0) -> float:
    """Communication left on the critical path: `overlap` of the overlappable part hides behind
    `window` seconds of compute (at most all of the window); `fixed` never overlaps."""
    hidden = overlap * min(overlappable, window)
    return overlappable - hidden + fixed


def algbw_to_busbw(op: str, algbw: float, n: int) -> float:
    """nccl-tests' bus bandwidth: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n,
    broadcast 1 times the algorithm bandwidth (size / time), so every op compares with the link's
    peak (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md)."""
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
              "reduce_scatter": (n - 1) / n, "broadcast": 1.0}[op]
    return algbw * factor
