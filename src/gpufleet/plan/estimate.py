"""One plan: a model and a workload on one cluster with one layout, turned into memory, time and
money. Pure: the catalog rows, the calibration and the assumptions are passed in or read from
the cached data files; nothing here touches processes, files or clocks.

The pieces come from memory.py, compute.py, comm.py and cost.py, so each formula is tested on
its own and this module only wires them (docs/planning.md walks through the wiring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpufleet import catalog
from gpufleet.catalog import GpuType
from gpufleet.parallelism import SHARDED, Layout
from gpufleet.plan import comm, compute, cost, memory
from gpufleet.plan.calibration import Calibration, busbw_at, device_tflops
from gpufleet.plan.models import Model, gib, layer_params, lora_params

INTER_NODE = ("infiniband", "ethernet")
GB = 1e9


@dataclass(frozen=True)
class Workload:
    """What is trained and how much: the same for every cluster a search compares."""

    model: Model
    seq: int
    micro_batch: int = 1
    samples: int | None = None
    precision: str = "bf16-mixed"
    framework: str = "torchrun"
    lora_rank: int | None = None  # None: full fine-tuning or pre-training
    recompute: str = "none"  # "none", "selective" or "full" (--checkpointing)
    attention: str = "flash"  # "flash" (fused, no score matrix kept) or "eager"
    sequence_parallel: bool = False
    grad_accum: int = 1  # micro-batches per step without pipeline parallelism
    # When gradients are reduced during accumulation: after every micro-batch (gpufleet's
    # train.forward_backward, which has no `no_sync`) or once per step (Megatron, DeepSpeed DDP).
    grad_sync: str = "micro-batch"

    @property
    def trainable(self) -> int:
        return lora_params(self.model, self.lora_rank) if self.lora_rank else self.model.params


@dataclass(frozen=True)
class Plan:
    model: Model
    workload: Workload
    gpu: str
    count: int
    network: str
    nodes: int
    layout: Layout
    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    capacity: float | None  # bytes usable per GPU; None when unknown (CPU slots)
    compute_s: float  # with the pipeline bubble
    comm_total_s: float
    comm_exposed_s: float
    dp_comm_s: float
    tp_comm_s: float
    pp_comm_s: float
    bubble: float
    global_batch: int
    ideal_compute_s: float  # the same work at one device's rate, no bubble, no communication
    peak_tflops: float | None
    device_tflops: float  # the sustained rate used
    bandwidths_gbps: dict[str, float]
    usd_per_hour: dict[str, float]
    calibrated: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.total <= self.capacity

    @property
    def step_time_s(self) -> float:
        return self.compute_s + self.comm_exposed_s

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.samples_per_s * self.workload.seq

    @property
    def mfu(self) -> float | None:
        if not self.peak_tflops:
            return None
        m, w = self.model, self.workload
        attention = compute.attention_flops_per_token(m.layers, m.hidden, w.seq)
        useful = compute.model_flops_per_token(m.params, w.trainable, attention)
        return compute.mfu(useful * self.tokens_per_s, self.count, self.peak_tflops * 1e12)

    @property
    def scaling_efficiency(self) -> float:
        """Throughput over `count` times one device's: ideal compute time over the step time."""
        step = self.step_time_s
        return self.ideal_compute_s / step if 0 < step < math.inf else 0.0

    @property
    def wall_time_h(self) -> float | None:
        if self.workload.samples is None or self.samples_per_s <= 0:
            return None
        return self.workload.samples / self.samples_per_s / 3600

    @property
    def cost_usd(self) -> dict[str, float]:
        hours = self.wall_time_h
        if hours is None:
            return {}
        return {book: rate * hours for book, rate in self.usd_per_hour.items()}

    @property
    def cheapest_usd(self) -> float | None:
        costs = self.cost_usd
        return min(costs.values()) if costs else None

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        costs = self.cost_usd
        saving = None
        if len(costs) >= 2:
            low, high = min(costs.values()), max(costs.values())
            saving = {"usd": high - low, "fraction": (high - low) / high if high else 0.0,
                      "cheapest": min(costs, key=lambda b: costs[b])}
        return {
            "model": {"name": self.model.name, "params": self.model.params, "trainable": w.trainable,
                      "layers": self.model.layers, "hidden": self.model.hidden, "heads": self.model.heads,
                      "source": self.model.source, "shape_assumed": self.model.shape_assumed},
            "cluster": {"gpu": self.gpu, "count": self.count, "network": self.network,
                        "nodes": self.nodes},
            "layout": {"strategy": self.layout.strategy, "data_parallel": self.layout.data_parallel,
                       "dp": self.layout.dp, "tp": self.layout.tp, "pp": self.layout.pp,
                       "microbatches": self.layout.microbatches, "schedule": self.layout.schedule,
                       "precision": self.layout.precision, "framework": self.layout.framework},
            "workload": {"seq": w.seq, "micro_batch": w.micro_batch, "global_batch": self.global_batch,
                         "samples": w.samples, "lora_rank": w.lora_rank, "recompute": w.recompute,
                         "attention": w.attention, "sequence_parallel": w.sequence_parallel},
            "fits": self.fits,
            "memory_gib": {"weights": gib(self.weights), "gradients": gib(self.gradients),
                           "optimizer": gib(self.optimizer), "activations": gib(self.activations),
                           "buffers": gib(self.buffers), "total": gib(self.total),
                           "capacity": None if self.capacity is None else gib(self.capacity)},
            "step_time_s": self.step_time_s,
            "compute_time_s": self.compute_s,
            "comm_time_s": self.comm_exposed_s,
            "comm_total_s": self.comm_total_s,
            "comm_s": {"data_parallel": self.dp_comm_s, "tensor_parallel": self.tp_comm_s,
                       "pipeline": self.pp_comm_s},
            "bubble_fraction": self.bubble,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "scaling_efficiency": self.scaling_efficiency,
            "wall_time_h": self.wall_time_h,
            "usd_per_hour": self.usd_per_hour,
            "cost_usd": costs,
            "saving": saving,
            "rates": {"peak_tflops": self.peak_tflops, "device_tflops": self.device_tflops,
                      "bandwidth_gbps": self.bandwidths_gbps, "calibrated": list(self.calibrated)},
            "notes": list(self.notes),
        }


def peak_tflops(gpu: GpuType, precision: str) -> float:
    """Dense peak in the precision's compute dtype (tensor cores for 16-bit, FP32 otherwise)."""
    return {"bf16-mixed": gpu.bf16_tflops, "fp16-mixed": gpu.fp16_tflops}.get(precision, gpu.fp32_tflops)


def nodes_for(count: int) -> int:
    per_node = int(catalog.planner_defaults()["gpus_per_node"])
    return max(1, math.ceil(count / per_node))


def cluster_problems(gpu: GpuType, count: int, network: str) -> list[tuple[str, str]]:
    """Why this cluster shape cannot exist: the same node and fabric rules `launch` applies."""
    per_node = int(catalog.planner_defaults()["gpus_per_node"])
    fabrics = catalog.interconnects()
    problems: list[tuple[str, str]] = []
    if network not in fabrics:
        problems.append(("network", f"unknown network '{network}'; allowed: {', '.join(fabrics)}"))
        return problems
    if count < 1 or count > 128:
        problems.append(("count", f"got {count}; a job spans 1 to 128 GPUs"))
    elif count > per_node:
        if count % per_node:
            problems.append(("count", f"{count} GPUs span nodes of {per_node}; use a multiple of "
                             f"{per_node} (allowed above {per_node}: 16, 24, ... 128)"))
        if network not in INTER_NODE:
            problems.append(("network", f"{network} connects GPUs within one node; {count} GPUs "
                             f"need {nodes_for(count)} nodes and one of: {', '.join(INTER_NODE)}"))
    elif count > fabrics[network].max_gpus:
        problems.append(("network", f"{network} connects at most {fabrics[network].max_gpus} GPUs; "
                         f"{count} need nvswitch (one node) or a network fabric"))
    if network in ("nvlink", "nvswitch") and gpu.nvlink_gbps <= 0 and not gpu.is_cpu:
        problems.append(("network", f"{gpu.name} has no NVLink; allowed networks for it: pcie, "
                         f"{', '.join(INTER_NODE)}"))
    return problems


def _link(gpu: GpuType, network: str, crosses_nodes: bool, group: int,
          efficiency: float) -> tuple[float, float]:
    """(bytes/s, latency s) of the slowest link of a group of `group` GPUs at the assumed
    efficiency. A multi-node cluster's `network` joins the nodes; inside each node the GPU
    type's usual fabric is assumed, or PCIe where that fabric connects fewer GPUs than the group
    (NVLink bridges join pairs or fours). Inside a node the speed is capped by the GPU's own
    NVLink rate (an A100 on NVSwitch gets 300 GB/s, not H100's 450)."""
    fabrics = catalog.interconnects()
    if crosses_nodes:
        name = network
    elif network in INTER_NODE:
        name = gpu.node_fabric  # inside one node of a cluster whose nodes the network joins
        if fabrics[name].max_gpus < group:
            name = "pcie"
    else:
        name = network
    fabric = fabrics[name]
    bw = fabric.bw_gbps_per_direction
    if name in ("nvlink", "nvswitch") and gpu.nvlink_gbps > 0:
        bw = min(bw, gpu.nvlink_gbps)
    return bw * GB * efficiency, fabric.latency_us * 1e-6


def estimate(workload: Workload, gpu: GpuType, count: int, network: str, layout: Layout,
             calibration: Calibration | None = None) -> Plan:
    """Memory, step time, throughput and cost of `workload` on `count` x `gpu` over `network`
    with `layout`. The caller has validated the layout (parallelism.resolve) and the cluster
    (cluster_problems)."""
    d = catalog.planner_defaults()
    model, w = workload.model, workload
    notes: list[str] = []
    calibrated: list[str] = []
    nodes = nodes_for(count)
    per_node = int(d["gpus_per_node"])
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    cal = calibration if calibration is not None and calibration.gpu == gpu.name else None
    if calibration is not None and cal is None:
        notes.append(f"the calibration measured {calibration.gpu}, not {gpu.name}: catalog rates used")
    if cal is not None and cal.collectives and cal.network != network:
        notes.append(f"the calibration measured collectives over {cal.network}, not {network}: "
                     "catalog bandwidth used")
    if cal is not None and cal.precision is not None and cal.precision != w.precision:
        notes.append(f"the calibration ran {cal.precision}, this plan is {w.precision}: its compute "
                     "rate may not carry over")
    mixed = w.precision != "fp32"
    act_bytes = 2 if mixed else 4
    microbatches = layout.microbatches if pp > 1 else w.grad_accum
    trainable = w.trainable

    # -- memory -------------------------------------------------------------------------------
    lora = w.lora_rank is not None
    state = memory.model_state(model.params, trainable, data_parallel=layout.data_parallel, dp=dp,
                               tp=tp, pp=pp, precision=w.precision, framework=layout.framework,
                               adapters=lora)
    per_layer = memory.activation_bytes_per_layer(
        w.seq, w.micro_batch, model.hidden, model.heads, tp=tp, sequence_parallel=w.sequence_parallel,
        recompute=w.recompute, attention=w.attention, element_bytes=act_bytes)
    logits = memory.logits_bytes(w.seq, w.micro_batch, model.vocab, tp)
    working = 0.0
    if w.recompute == "full":
        working = memory.activation_bytes_per_layer(
            w.seq, w.micro_batch, model.hidden, model.heads, tp=tp,
            sequence_parallel=w.sequence_parallel, recompute="none", attention=w.attention,
            element_bytes=act_bytes)
    acts = memory.activations(model.layers, per_layer, logits, pp=pp, microbatches=microbatches,
                              schedule=layout.schedule, working_layer=working)
    reserve = 0.0 if gpu.is_cpu else d["runtime_reserve_gib"] * 2**30
    one_layer = layer_params(model.arch, model.hidden, model.heads, model.kv_heads, model.ffn,
                             model.head_dim)
    bufs = memory.buffers(data_parallel=layout.data_parallel, framework=layout.framework,
                          grads_bytes=state.gradients, layer_params=one_layer, tp=tp,
                          compute_bytes=act_bytes, reserve_bytes=reserve)
    capacity = None if gpu.is_cpu else gpu.memory_gb * 2**30 * (1 - d["memory_headroom"])

    # -- compute ------------------------------------------------------------------------------
    peak = peak_tflops(gpu, w.precision) or None
    rate_tflops = device_tflops(cal, count) if cal else None
    if rate_tflops is not None:
        calibrated.append("compute")
        single_tflops = device_tflops(cal, 1) if cal else None
    else:
        rate_tflops = (peak or 0.0) * d["compute_efficiency"]
        single_tflops = rate_tflops
    if not rate_tflops:
        notes.append(f"{gpu.name} has no rated peak: calibrate with `gpufleet bench scaling`")
    attention = compute.attention_flops_per_token(model.layers, model.hidden, w.seq)
    fpt = compute.flops_per_token(model.params, trainable, "full" if w.recompute == "full" else "none",
                                  attention)
    tokens_per_replica = w.micro_batch * w.seq * microbatches
    flops_per_device = tokens_per_replica * fpt / (tp * pp)
    busy = compute.compute_seconds(flops_per_device, rate_tflops * 1e12)
    compute_s = compute.with_bubble(busy, pp, microbatches)
    ideal = compute.compute_seconds(flops_per_device, (single_tflops or rate_tflops) * 1e12)

    # -- communication ------------------------------------------------------------------------
    eff = d["bandwidth_efficiency"]
    dp_crosses = nodes > 1 and dp * tp > per_node
    dp_bw, dp_lat = _link(gpu, network, dp_crosses, min(count, dp * tp), eff)
    tp_bw, tp_lat = _link(gpu, network, False, tp, eff)
    pp_bw, pp_lat = _link(gpu, network, nodes > 1, min(count, per_node), eff)
    local_trainable = trainable / (tp * pp)
    local_params = (model.params + (trainable if lora else 0)) / (tp * pp)
    grad_bytes = 2 if layout.framework == "deepspeed" and mixed else 4

    used_dp_bw: list[float] = []

    def link_for(op: str, size: float) -> tuple[float, float]:
        """The calibrated bus bandwidth of `op` at this size (its latency included), else the
        catalog link's."""
        measured = busbw_at(cal, op, size) if cal and cal.network == network and dp > 1 else None
        if measured:
            calibrated.append(f"{op} bandwidth")
            used_dp_bw.append(measured * GB)
            return measured * GB, 0.0
        used_dp_bw.append(dp_bw)
        return dp_bw, dp_lat

    # gpufleet syncs gradients on every micro-batch of an accumulation (no `no_sync`); a
    # pipeline schedule syncs once per step. Sharded weights are gathered per micro-batch.
    syncs = 1 if pp > 1 or w.grad_sync == "step" else microbatches
    dp_s = comm.data_parallel_s(layout.data_parallel, local_trainable, local_params, grad_bytes,
                                act_bytes, dp, link_for, syncs=syncs, gathers=microbatches)
    tp_s = comm.tensor_parallel_s(model.layers / pp, microbatches, w.seq, w.micro_batch, model.hidden,
                                  tp, act_bytes, tp_bw, tp_lat, w.recompute)
    pp_s = comm.pipeline_s(microbatches, w.seq, w.micro_batch, model.hidden, pp, act_bytes, pp_bw, pp_lat)
    # DDP-style methods overlap each all-reduce with its micro-batch's backward (2/3 of its
    # compute); sharded ones prefetch gathers during forward and backward of every micro-batch.
    sharded_weights = "parameters" in SHARDED[layout.data_parallel]
    window = busy if sharded_weights else busy * syncs / microbatches * 2 / 3
    exposed = comm.exposed_s(dp_s, window, d["overlap"], fixed=tp_s + pp_s)

    rates: dict[str, float] = {}
    for book in catalog.price_books():
        r = cost.cluster_rate(gpu.name, count, network, book)
        if r is not None:
            rates[book] = r.usd_per_hour
    if model.shape_assumed:
        notes.append("shape assumed from the parameter count: activations are rough")
    return Plan(
        model=model, workload=w, gpu=gpu.name, count=count, network=network, nodes=nodes,
        layout=layout, weights=state.weights, gradients=state.gradients, optimizer=state.optimizer,
        activations=acts, buffers=bufs, capacity=capacity, compute_s=compute_s,
        comm_total_s=dp_s + tp_s + pp_s, comm_exposed_s=exposed, dp_comm_s=dp_s, tp_comm_s=tp_s,
        pp_comm_s=pp_s, bubble=compute.bubble_fraction(pp, microbatches),
        global_batch=w.micro_batch * microbatches * dp, ideal_compute_s=ideal, peak_tflops=peak,
        device_tflops=rate_tflops, usd_per_hour=rates,
        bandwidths_gbps={"data_parallel": used_dp_bw[0] / GB, "tensor_parallel": tp_bw / GB,
                         "pipeline": pp_bw / GB},
        calibrated=tuple(dict.fromkeys(calibrated)), notes=tuple(notes),
    )
