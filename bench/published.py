"""The planner against published figures: prints the markdown table in docs/planning.md.

    .venv/bin/python bench/published.py

Every planner number here is computed by `gpufleet.plan` from the inputs each source states
(model shape, GPUs, parallelism, batch, sequence, precision, recomputation); the published
figure and its source are the only typed-in values. Inputs a source does not state are marked
"assumed" in the row. Runs in a second; needs no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import catalog
from gpufleet.parallelism import resolve
from gpufleet.plan import compute, memory
from gpufleet.plan.estimate import Plan, Workload, estimate
from gpufleet.plan.models import Model, from_catalog, param_count

GiB = 2**30


def shaped(name: str, arch: str, layers: int, hidden: int, heads: int, vocab: int, seq: int,
           kv_heads: int | None = None, ffn: int | None = None, tied: bool = True) -> Model:
    kv, f = kv_heads or heads, ffn or 4 * hidden
    return Model(name=name, arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn=f,
                 vocab=vocab, max_seq=seq, tied=tied,
                 params=param_count(arch, layers, hidden, heads, kv, f, vocab, seq, tied),
                 source="published shape")


def plan(model: Model, gpu: str, count: int, network: str, *, strategy: str = "fsdp", tp: int | None = None,
         pp: int | None = None, microbatches: int | None = None, micro_batch: int = 1, seq: int = 2048,
         recompute: str = "none", sp: bool = False, precision: str = "bf16-mixed",
         framework: str = "torchrun", lora_rank: int | None = None, grad_accum: int = 1,
         samples: int | None = None, grad_sync: str = "micro-batch") -> Plan:
    layout = resolve(strategy, count, tp=tp, pp=pp, microbatches=microbatches, precision=precision,
                     framework=framework)
    work = Workload(model=model, seq=seq, micro_batch=micro_batch, precision=precision, framework=framework,
                    recompute=recompute, sequence_parallel=sp, lora_rank=lora_rank,
                    grad_accum=grad_accum, samples=samples, grad_sync=grad_sync)
    return estimate(work, catalog.resolve_gpu(gpu), count, network, layout)


def hw_tflops(p: Plan) -> float:
    """Hardware FLOP/s per GPU the plan implies, recomputation included (what Megatron reports)."""
    m, w = p.model, p.workload
    attention = compute.attention_flops_per_token(m.layers, m.hidden, w.seq)
    fpt = compute.flops_per_token(m.params, w.trainable, "full" if w.recompute == "full" else "none",
                                  attention)
    return fpt * p.tokens_per_s / p.count / 1e12


@dataclass
class Row:
    case: str
    inputs: str
    metric: str
    published: float
    planner: float
    unit: str
    source: str

    def cells(self) -> list[str]:
        gap = (self.planner - self.published) / self.published if self.published else float("nan")
        fmt = (lambda x: f"{x:,.3g}") if self.unit != "%" else (lambda x: f"{x:.1f}")
        return [self.case, self.inputs, self.metric, f"{fmt(self.published)} {self.unit}",
                f"{fmt(self.planner)} {self.unit}", f"{gap:+.0%}", self.source]


def state_gb(params: float, data_parallel: str, dp: int, precision: str, framework: str) -> float:
    s = memory.model_state(int(params), int(params), data_parallel=data_parallel, dp=dp, tp=1, pp=1,
                           precision=precision, framework=framework)
    return s.total


def rows() -> list[Row]:
    out: list[Row] = []
    # ZeRO paper, figure 1 / sections 5.1-5.3: 7.5B parameters, 64-way data parallel, Adam, fp16.
    for method, published in (("ddp", 120), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9)):
        out.append(Row(f"ZeRO paper fig. 1, {method}", "7.5B, Nd=64, mixed-precision Adam",
                       "model state per GPU", published,
                       state_gb(7.5e9, method, 64, "bf16-mixed", "deepspeed") / 1e9, "GB",
                       "Rajbhandari et al. 2020, fig. 1"))
    # DeepSpeed's estimators, docs example: t5-3b (2851M params, 32M largest layer), 8 GPUs.
    for method, published in (("zero2", 15.93), ("zero3", 6.10)):
        out.append(Row(f"DeepSpeed estimator, {method}", "t5-3b 2851M params, 8 GPUs, no offload",
                       "model state per GPU", published,
                       state_gb(2851e6, method, 8, "bf16-mixed", "deepspeed") / GiB, "GiB",
                       "deepspeed.readthedocs.io/en/latest/memory.html"))

    # Megatron-LM (Narayanan et al. 2021) table 1: A100, seq 2048, vocab 51200, full recompute.
    # Micro-batch 1 is assumed (the table gives only the global batch).
    for name, heads, hidden, layers, tp, pp, gpus, batch, published in (
            ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137), ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
            ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163)):
        model = shaped(f"GPT {name}", "gpt2", layers, hidden, heads, 51200, 2048)
        dp = gpus // (tp * pp)
        per_replica = batch // dp
        p = plan(model, "A100-80GB", gpus, "infiniband", strategy="ddp", tp=tp if tp > 1 else None,
                 pp=pp if pp > 1 else None, microbatches=per_replica if pp > 1 else None,
                 grad_accum=per_replica if pp == 1 else 1, recompute="full", grad_sync="step")
        out.append(Row(f"Megatron-LM {name}", f"{gpus} A100, tp {tp} pp {pp}, batch {batch}, seq 2048, "
                       "full recompute, micro-batch 1 (assumed)", "TFLOP/s per GPU (with recompute)",
                       published, hw_tflops(p), "TFLOP/s", "Narayanan et al. 2021, table 1"))

    # Korthikanti et al. 2022 table 5: sequence parallel + selective recompute, A100, seq 2048.
    for name, heads, hidden, layers, tp, pp, gpus, batch, micro, published in (
            ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 41.5), ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 51.4)):
        model = shaped(f"GPT {name}", "gpt2", layers, hidden, heads, 51200, 2048)
        p = plan(model, "A100-80GB", gpus, "nvswitch" if gpus <= 8 else "infiniband", strategy="ddp",
                 tp=tp, pp=pp if pp > 1 else None, microbatches=batch // micro if pp > 1 else None,
                 micro_batch=micro, grad_accum=batch // micro if pp == 1 else 1, recompute="selective",
                 sp=True)
        out.append(Row(f"Korthikanti {name}", f"{gpus} A100, tp {tp} pp {pp}, batch {batch}, SP + selective",
                       "MFU", published, (p.mfu or 0) * 100, "%", "Korthikanti et al. 2022, table 5"))

    # torchtitan docs/performance.md (H100 at 500 W with 96 GB HBM2e; seq 8192 from its presets).
    llama8 = from_catalog(catalog.models()["llama3-8b"])
    llama70 = from_catalog(catalog.models()["llama3-70b"])
    p = plan(llama8, "H100-SXM", 8, "nvswitch", micro_batch=2, seq=8192, recompute="selective")
    out.append(Row("torchtitan Llama 3.1 8B", "8 H100, FSDP, local batch 2, seq 8192, selective AC",
                   "tokens/s per GPU", 5762, p.tokens_per_s / p.count, "tok/s",
                   "torchtitan docs/performance.md, table 1"))
    out.append(Row("torchtitan Llama 3.1 8B", "same", "peak memory per GPU", 82.4, p.total / GiB, "GiB",
                   "torchtitan docs/performance.md, table 1"))
    p = plan(llama70, "H100-SXM", 256, "infiniband", tp=8, micro_batch=16, seq=8192, recompute="full")
    out.append(Row("torchtitan Llama 3.1 70B", "256 H100, FSDP 32 x TP 8, local batch 16, seq 8192, "
                   "full AC (published run also used Float8)", "tokens/s per GPU", 829,
                   p.tokens_per_s / p.count, "tok/s", "torchtitan docs/performance.md, table 4"))
    p = plan(llama8, "A100-80GB", 64, "infiniband", micro_batch=1, seq=8192, recompute="selective")
    out.append(Row("torchtitan Llama 3 8B", "64 A100, FSDP, local batch 1, seq 8192, selective AC",
                   "MFU", 56.8, (p.mfu or 0) * 100, "%", "torchtitan docs/performance.md (2024 A100 table)"))

    # The seeds' own tables (seed 000): sequence length unstated; 2048 assumed.
    p = plan(llama70, "H100-SXM", 8, "nvswitch", micro_batch=1, seq=2048, recompute="full", samples=50000)
    out.append(Row("seed 000: Llama 3 70B full FT", "8 H100 FSDP, bf16, seq 2048 (assumed), full AC",
                   "memory per GPU", 38, p.total / 1e9, "GB", "seed 000 table"))
    out.append(Row("seed 000: Llama 3 70B full FT", "same", "samples/s", 0.77, p.samples_per_s, "samples/s",
                   "seed 000 table"))
    p = plan(llama8, "A100-80GB", 1, "pcie", strategy="ddp", micro_batch=1, seq=2048, lora_rank=16)
    out.append(Row("seed 000: Llama 3 8B LoRA", "1 A100, rank 16, seq 2048 (assumed)", "samples/s", 0.46,
                   p.samples_per_s, "samples/s", "seed 000 table"))

    # Collective bandwidth: the planner's own data-parallel link for the same clusters.
    for what, gpu, count, network, published, src in (
            ("8x H100 NVSwitch all-reduce busbw", "H100-SXM", 8, "nvswitch", 480,
             "Azure HPC benchmarks (NVLS); ~370 ring"),
            ("8x A100 NVSwitch all-reduce busbw", "A100-80GB", 8, "nvswitch", 231.6, "Azure HPC benchmarks"),
            ("400 Gb/s InfiniBand per GPU", "H100-SXM", 16, "infiniband", 47,
             "NCCL maintainers, nccl-tests issues: 46-48")):
        p = plan(llama8, gpu, count, network, strategy="ddp")
        out.append(Row("NCCL", what, "bus bandwidth", published, p.bandwidths_gbps["data_parallel"],
                       "GB/s", src))
    return out


def table(rs: list[Row]) -> str:
    head = ["case", "inputs", "metric", "published", "planner", "gap", "source"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rs]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(rows()))
