"""`plan`: memory, speed and cost of a training run before any GPU is rented."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.app import COMMAND, app, out
from gpufleet.cli.options import (
    Count,
    Dp,
    Framework,
    Gpu,
    Json,
    Microbatches,
    ModelConfig,
    Params,
    PlanNetwork,
    PlanPrecision,
    Pp,
    PpSchedule,
    Strategy,
    Tp,
    default,
)


@app.command(cls=COMMAND)
def plan(
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="A catalog model (--list-models).")] = None,
    params: Params = None,
    config: ModelConfig = None,
    gpu: Gpu = None,
    count: Count = None,
    network: PlanNetwork = None,
    strategy: Strategy = None,
    dp: Dp = None,
    tp: Tp = None,
    pp: Pp = None,
    pp_schedule: PpSchedule = None,
    microbatches: Microbatches = None,
    precision: PlanPrecision = None,
    framework: Framework = None,
    micro_batch: Annotated[int | None, typer.Option(
        "--micro-batch", help="Samples per GPU per micro-batch." + default("1"))] = None,
    seq: Annotated[int | None, typer.Option(
        "--seq", help="Tokens per sample." + default("2048, or the model's limit"))] = None,
    grad_accum: Annotated[int | None, typer.Option(
        "--grad-accum", help="Micro-batches per optimizer step." + default("1"))] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Samples to train on.")] = None,
    lora: Annotated[bool, typer.Option("--lora", help="LoRA fine-tuning (frozen base).")] = False,
    lora_rank: Annotated[int | None, typer.Option(
        "--lora-rank", help="LoRA rank." + default("16"))] = None,
    checkpointing: Annotated[bool, typer.Option(
        "--checkpointing", help="Full activation checkpointing (recompute each layer).")] = False,
    attention: Annotated[str | None, typer.Option(
        "--attention", help="flash (fused) or eager." + default("flash"))] = None,
    sequence_parallel: Annotated[bool, typer.Option(
        "--sequence-parallel", help="Megatron sequence parallelism with tp.")] = False,
    calibration: Annotated[str | None, typer.Option(
        "--calibration", help="A file from `gpufleet bench`, used instead of catalog rates.")] = None,
    deadline: Annotated[str | None, typer.Option(
        "--deadline", help="Rank every cluster finishing within this (e.g. 24h), cheapest first.")] = None,
    budget: Annotated[float | None, typer.Option(
        "--budget", help="Rank every cluster that costs at most this many dollars.")] = None,
    top: Annotated[int | None, typer.Option("--top", help="Rows of a ranking." + default("10"))] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Also draw a PNG here.")] = None,
    list_models: Annotated[bool, typer.Option("--list-models", help="List catalog models.")] = False,
    as_json: Json = False,
) -> None:
    """Memory, speed and cost of training a model before you rent GPUs; or rank every cluster
    against a --deadline or --budget."""
    from gpufleet.plan import command
    from gpufleet.spec_plan import PlanSpec

    if list_models:
        command.list_models(as_json, out)
        return
    spec = PlanSpec.parse({
        "model": model, "params": params, "config": config, "gpu": gpu, "count": count,
        "network": network, "strategy": strategy, "dp": dp, "tp": tp, "pp": pp,
        "pp_schedule": pp_schedule, "microbatches": microbatches, "precision": precision,
        "framework": framework, "micro_batch": micro_batch, "seq": seq, "grad_accum": grad_accum,
        "samples": samples, "lora": lora, "lora_rank": lora_rank, "checkpointing": checkpointing,
        "attention": attention, "sequence_parallel": sequence_parallel, "calibration": calibration,
        "deadline": deadline, "budget": budget, "top": top,
    })
    command.run(spec, as_json, plot, out)
