"""`doctor` (is this machine ready to train) and `bench ...` (measure a cluster)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.app import COMMAND, app, group, out
from gpufleet.cli.connect import client
from gpufleet.cli.options import (
    CalibrationOut,
    CpuSlots,
    IdleCluster,
    Json,
    ModelConfig,
    Params,
    RunPrecision,
    Strategy,
    default,
)
from gpufleet.errors import SpecError
from gpufleet.vocab import PULLS, spoken


def here_only(command: str) -> None:
    """Refuse measuring a cluster while this CLI talks to a server: the measurement runs on
    this machine, against clusters of its own state, which are not the server's."""
    client().refuse_here_only(command)


@app.command(cls=COMMAND)
def doctor(
    cluster: Annotated[str | None, typer.Option(
        "--cluster", "-c", help="Check this cluster's devices and environment.")] = None,
    as_json: Json = False,
    image: Annotated[str | None, typer.Option(
        "--image", help="Check this container image on this host instead: the runtime, the "
        "image, its Python, torch, CUDA against the driver, /dev/shm.")] = None,
    pull: Annotated[str, typer.Option(
        "--pull", help=f"With --image: {spoken(PULLS)}.")] = "missing",
    shm_size: Annotated[str | None, typer.Option(
        "--shm-size", help="With --image: the job's --shm-size, e.g. 8g." + default(
            "host IPC"))] = None,
    container_opts: Annotated[list[str] | None, typer.Option(
        "--container-opt", help="With --image: an extra runtime option the job passes "
        "(repeatable).")] = None,
) -> None:
    """Check this machine for training: devices, driver/CUDA/torch/NCCL versions, BF16,
    topology, NCCL settings, /dev/shm, open files, disk, and a real all-reduce; or, with
    --image, that image."""
    if cluster is not None:  # without --cluster it checks this machine, server or not
        here_only("doctor --cluster")
    from gpufleet.doctor.command import container_of
    from gpufleet.doctor.command import doctor as run_doctor

    container = (container_of(image, pull, shm_size, tuple(container_opts or ()))
                 if image is not None else None)
    raise typer.Exit(run_doctor(cluster, as_json, out, container))


bench_app = group("Measure a cluster (collective bandwidth, a script's scaling) and save a "
                  "calibration file for `plan --calibration`.")
app.add_typer(bench_app, name="bench")


@bench_app.command("allreduce", cls=COMMAND)
def bench_allreduce(
    cluster: IdleCluster,
    sizes: Annotated[str | None, typer.Option(
        "--sizes", help="Bytes: 1K,1M,64M or MIN:MAX in steps of 4."
        + default("1K:64M on CPU, 1K:1G on GPUs"))] = None,
    iters: Annotated[int, typer.Option("--iters", help="Timed calls per size.", min=1, max=10000)] = 20,
    out_file: CalibrationOut = None,
    as_json: Json = False,
) -> None:
    """All-reduce, all-gather, reduce-scatter and broadcast over a size sweep, nccl-tests style
    (time, algbw, busbw) against the interconnect's catalog peak."""
    from gpufleet.measure import collectives, command

    here_only("bench allreduce")
    try:
        parsed = collectives.parse_sizes(sizes) if sizes else None
    except ValueError as exc:
        raise SpecError([("sizes", f"{exc}; use e.g. 1K,1M,64M or 1K:64M")]) from None
    command.allreduce(cluster, parsed, iters, out_file, as_json, out)


@bench_app.command("scaling", cls=COMMAND,
                   context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def bench_scaling(
    ctx: typer.Context,
    cluster: IdleCluster,
    script: Annotated[str, typer.Option("--script", help="Training script; its arguments after --.")],
    workers: Annotated[str, typer.Option("--workers", help="World sizes, e.g. 1,2,4.")] = "1,2",
    model: Annotated[str | None, typer.Option(
        "--model", help="Catalog model the script trains, to turn samples/s into FLOP/s.")] = None,
    params: Params = None,
    config: ModelConfig = None,
    seq: Annotated[int | None, typer.Option(
        "--seq", help="Tokens per sample." + default("the model's"))] = None,
    strategy: Strategy = None,
    precision: RunPrecision = None,
    out_file: CalibrationOut = None,
    cpu_slots: CpuSlots = None,
    as_json: Json = False,
) -> None:
    """Run a script at each world size through `gpufleet run`; print samples/s, scaling
    efficiency and cost per 1,000 samples, like the seed's benchmark tables. --strategy and
    --precision are passed to `gpufleet run`."""
    from gpufleet.measure import command
    from gpufleet.plan.command import load_model
    from gpufleet.spec_plan import PlanSpec

    here_only("bench scaling")
    strategy, precision = strategy or "ddp", precision or "fp32"  # run's defaults, said in --help
    try:
        sizes = sorted({int(w) for w in workers.split(",") if w.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise SpecError([("workers", f"'{workers}' is not a list of world sizes; use e.g. 1,2,4")])
    # The same validation as `plan` (model source, strategy and precision names).
    spec = PlanSpec.parse({"model": model, "params": params, "config": config, "gpu": "cpu",
                           "seq": seq, "strategy": strategy, "precision": precision},
                          model_optional=True)
    the_model = load_model(spec) if (model or params or config) else None
    command.scaling(cluster, script, sizes, list(ctx.args), the_model, seq, out_file, as_json,
                    strategy, precision, cpu_slots, out)
