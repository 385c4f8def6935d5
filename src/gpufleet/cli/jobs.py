"""Job commands: `run` (and `run --resume`), `logs` and `status`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.app import COMMAND, app, out, print_json
from gpufleet.cli.client import JobInput
from gpufleet.cli.connect import client
from gpufleet.cli.follow import print_queued
from gpufleet.cli.help import with_panels
from gpufleet.cli.options import (
    After,
    BootstrapOpt,
    ContainerOpt,
    Count,
    CpuSlots,
    Disk,
    Dp,
    Framework,
    Gpu,
    Image,
    Json,
    KeepWorkdir,
    LossPattern,
    MaxUpload,
    Microbatches,
    Network,
    Nodes,
    NoQueue,
    OnCluster,
    PoolOpt,
    Pp,
    PpSchedule,
    PreloadOpt,
    PriceBook,
    Priority,
    PullOpt,
    RunPrecision,
    Setup,
    ShmSizeOpt,
    Spares,
    Strategy,
    TimeLimit,
    TotalSteps,
    Tp,
    WarmOpt,
    Yes,
    default,
)
from gpufleet.errors import SpecError

CLUSTER, LAYOUT, PRECISION = "Cluster", "Layout", "Precision and framework"
SURVIVAL, OUTPUT, PROGRESS = "Survival", "Output", "Progress of any script"
TRAVEL = "Code and environment that travel"
IMAGE = "Container image"
QUEUE = "Queue"
RUN_PANELS = {
    **dict.fromkeys(("cluster", "gpu", "count", "network", "disk", "price_book", "nodes", "spares",
                     "pool", "cpu_slots", "keep"), CLUSTER),
    **dict.fromkeys(("workers_per_node", "strategy", "dp", "tp", "pp", "pp_schedule",
                     "microbatches"), LAYOUT),
    **dict.fromkeys(("precision", "framework", "env", "warm", "preload"), PRECISION),
    **dict.fromkeys(("max_restarts", "hang_timeout", "checkpoint_to", "workers", "scale_up_util",
                     "scale_down_util", "cooldown", "scale_tolerance", "resume"), SURVIVAL),
    **dict.fromkeys(("total_steps", "loss_pattern", "bootstrap"), PROGRESS),
    **dict.fromkeys(("setup", "max_upload", "keep_workdir"), TRAVEL),
    **dict.fromkeys(("image", "pull", "container_opt", "shm_size"), IMAGE),
    **dict.fromkeys(("priority", "time_limit", "after", "no_queue"), QUEUE),
    **dict.fromkeys(("name", "file", "dry_run", "detach", "yes", "help"), OUTPUT),
}


@app.command(cls=with_panels(RUN_PANELS),
             context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def run(
    ctx: typer.Context,
    script: Annotated[str | None, typer.Argument(help="Training script; its arguments go after --.")] = None,
    cluster: OnCluster = None,
    gpu: Gpu = None,
    count: Count = None,
    network: Network = None,
    disk: Disk = None,
    price_book: PriceBook = None,
    nodes: Nodes = None,
    spares: Spares = None,
    pool: PoolOpt = None,
    cpu_slots: CpuSlots = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep a new cluster after the job.")] = False,
    workers_per_node: Annotated[int | None, typer.Option(
        "--workers-per-node", help="Processes per node." + default("one per device"))] = None,
    strategy: Strategy = None,
    dp: Dp = None,
    tp: Tp = None,
    pp: Pp = None,
    pp_schedule: PpSchedule = None,
    microbatches: Microbatches = None,
    precision: RunPrecision = None,
    framework: Framework = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE for workers.")] = None,
    max_restarts: Annotated[int | None, typer.Option(
        "--max-restarts", help="Restarts of the worker group on failure, from the last "
        "checkpoint." + default("0"))] = None,
    hang_timeout: Annotated[str | None, typer.Option(
        "--hang-timeout", help="No rank reporting for this long is a hang, handled as a "
        "failure." + default("5m"))] = None,
    checkpoint_to: Annotated[str | None, typer.Option(
        "--checkpoint-to", help="Durable folder or fsspec URL checkpoints are copied to; "
        "needed with --max-restarts or --resume where the nodes do not share this machine's "
        "files.")] = None,
    workers: Annotated[str | None, typer.Option(
        "--workers", help="Elastic worker range MIN:MAX: resizes tried on utilization, kept "
        "on goodput.")] = None,
    scale_up_util: Annotated[float | None, typer.Option(
        "--scale-up-util", help="Try growing at or above this mean utilization." + default("0.9"))] = None,
    scale_down_util: Annotated[float | None, typer.Option(
        "--scale-down-util", help="Try shrinking at or below this." + default("0.5"))] = None,
    cooldown: Annotated[str | None, typer.Option(
        "--cooldown", help="Wait after a start or resize before the next." + default("60s"))] = None,
    scale_tolerance: Annotated[float | None, typer.Option(
        "--scale-tolerance", help="Revert a resize that lowers samples per $ by more than "
        "this share." + default("0.1"))] = None,
    resume: Annotated[str | None, typer.Option(
        "--resume", help="Start an ended job again from its last checkpoint.")] = None,
    setup: Setup = None,
    max_upload: MaxUpload = None,
    keep_workdir: KeepWorkdir = False,
    image: Image = None,
    pull: PullOpt = None,
    container_opt: ContainerOpt = None,
    shm_size: ShmSizeOpt = None,
    total_steps: TotalSteps = None,
    loss_pattern: LossPattern = None,
    bootstrap: BootstrapOpt = True,
    warm: WarmOpt = None,
    preload: PreloadOpt = None,
    priority: Priority = None,
    time_limit: TimeLimit = None,
    after: After = None,
    no_queue: NoQueue = False,
    name: Annotated[str | None, typer.Option("--name", help="Job name.")] = None,
    file: Annotated[Path | None, typer.Option("-f", "--file", help="Job YAML.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print each node's command, env and generated configs; start nothing.")] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return at once.")] = False,
    yes: Yes = False,
) -> None:
    """Run a torchrun-style script on a cluster (existing, or new from --gpu/--count).

    When its devices are busy the job is queued (gpufleet jobs shows its place) and starts
    when its whole gang is free; --no-queue refuses instead."""
    if resume is not None:
        named = [opt for opt, v in (("SCRIPT", script), ("-f", file), ("--cluster", cluster),
                                    ("--gpu", gpu), ("--count", count), ("--name", name),
                                    ("--after", after), ("--image", image))
                 if v is not None]
        if named or ctx.args:
            raise SpecError([("resume", f"--resume continues a job as it was defined; drop "
                              f"{', '.join(named) or 'the script arguments'}")])
        client().resume(resume, yes, cpu_slots, detach)
        return
    flags = {"name": name, "workers_per_node": workers_per_node, "strategy": strategy,
             "dp": dp, "tp": tp, "pp": pp, "pp_schedule": pp_schedule, "microbatches": microbatches,
             "precision": precision, "framework": framework, "max_restarts": max_restarts,
             "keep": keep or None, "hang_timeout": hang_timeout,
             "checkpoint_to": checkpoint_to, "workers": workers, "scale_up_util": scale_up_util,
             "scale_down_util": scale_down_util, "cooldown": cooldown,
             "scale_tolerance": scale_tolerance,
             "total_steps": total_steps, "loss_pattern": loss_pattern,
             "bootstrap": None if bootstrap else False, "warm": warm,
             "preload": preload, "priority": priority,
             "time_limit": time_limit, "after": after, "setup": setup,
             "max_upload": max_upload, "keep_workdir": keep_workdir or None,
             "image": image, "pull": pull, "container_opts": container_opt or None,
             "shm_size": shm_size}
    inline = {"gpu": gpu, "count": count, "network": network, "disk": disk,
              "price_book": price_book, "nodes": nodes, "spares": spares, "pool": pool}
    job = JobInput(file, script, list(ctx.args), env or [], flags, inline, cluster)
    client().run(job, not no_queue, cpu_slots, detach, dry_run, yes)


@app.command(cls=COMMAND)
def logs(
    job: Annotated[str, typer.Argument(help="Job name.")],
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing until it ends; then exit as `run` does: 0 if it "
        "succeeded, 1 if not (130 after Ctrl-C, which leaves the job running).")] = False,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank's log.")] = None,
) -> None:
    """A job's output, every rank's lines prefixed by their rank, or one rank with --rank."""
    from gpufleet.status import CTRL_C_EXIT, exit_code

    try:
        status = client().logs(job, follow, rank)
    except KeyboardInterrupt:  # leaving the log does not stop the job
        raise typer.Exit(CTRL_C_EXIT) from None
    if follow:
        raise typer.Exit(exit_code(status))


@app.command(cls=COMMAND)
def status(
    job: Annotated[str, typer.Argument(help="Job name.")],
    as_json: Json = False,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Follow until the job ends, even when not on a terminal.")] = False,
    once: Annotated[bool, typer.Option("--once", help="Print once, do not follow.")] = False,
) -> None:
    """A job's progress, devices, diagnosis and events: live on a terminal while it runs.

    Step, samples/s, loss, cost so far, ETA and projected cost; per device utilization and
    memory; per rank step, data-wait and communication time; findings with the fix to try.
    """
    on = client()
    detail = on.job(job)
    if "queued" in detail:  # no job record yet: its place in the queue
        print_queued(detail, as_json)
        return
    if as_json:
        print_json(detail)
        return
    from gpufleet import ui
    from gpufleet.status import JOB_ACTIVE

    follow = (watch or (out.is_terminal and not once)) and detail["status"] in JOB_ACTIVE
    if not follow:
        out.print(ui.status_view(detail))
        return
    from rich.live import Live

    from gpufleet.cli.terminal import unechoed

    try:
        with unechoed(out.file), Live(ui.status_view(detail), console=out,
                                      refresh_per_second=2) as live:
            while detail["status"] in JOB_ACTIVE:
                time.sleep(on.poll_s)
                detail = on.job(job)
                live.update(ui.status_view(detail))
    except KeyboardInterrupt:  # leaving the view does not stop the job
        return

