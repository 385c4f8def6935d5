"""Job commands: `run` (and `run --resume`), `logs` and `status`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.app import (
    COMMAND,
    app,
    approve_quote,
    err,
    out,
    print_json,
    remote,
    say,
    store,
)
from gpufleet.cli.help import with_panels
from gpufleet.cli.job_spec import job_data, job_spec
from gpufleet.cli.options import (
    After,
    BootstrapOpt,
    Count,
    CpuSlots,
    Disk,
    Dp,
    Framework,
    Gpu,
    Json,
    LossPattern,
    Microbatches,
    Network,
    Nodes,
    NoQueue,
    OnCluster,
    PoolOpt,
    Pp,
    PpSchedule,
    PriceBook,
    Priority,
    RunPrecision,
    Strategy,
    TimeLimit,
    TotalSteps,
    Tp,
    Yes,
    default,
)
from gpufleet.cli.queue import print_queued, queue_row, queued_first, remote_logs
from gpufleet.cli.supervising import hand_over, print_dry_run, script_notes, warned_first
from gpufleet.errors import SpecError
from gpufleet.server.seg import seg

if TYPE_CHECKING:
    from gpufleet.store import Store

CLUSTER, LAYOUT, PRECISION = "Cluster", "Layout", "Precision and framework"
SURVIVAL, OUTPUT, PROGRESS = "Survival", "Output", "Progress of any script"
QUEUE = "Queue"
RUN_PANELS = {
    **dict.fromkeys(("cluster", "gpu", "count", "network", "disk", "price_book", "nodes", "pool",
                     "cpu_slots", "keep"), CLUSTER),
    **dict.fromkeys(("workers_per_node", "strategy", "dp", "tp", "pp", "pp_schedule",
                     "microbatches"), LAYOUT),
    **dict.fromkeys(("precision", "framework", "env"), PRECISION),
    **dict.fromkeys(("max_restarts", "hang_timeout", "checkpoint_to", "workers", "scale_up_util",
                     "scale_down_util", "cooldown", "scale_tolerance", "resume"), SURVIVAL),
    **dict.fromkeys(("total_steps", "loss_pattern", "bootstrap"), PROGRESS),
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
        "--checkpoint-to", help="Durable folder or fsspec URL checkpoints are copied to.")] = None,
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
    total_steps: TotalSteps = None,
    loss_pattern: LossPattern = None,
    bootstrap: BootstrapOpt = True,
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
    from gpufleet.lifecycle import submit

    if resume is not None:
        named = [opt for opt, v in (("SCRIPT", script), ("-f", file), ("--cluster", cluster),
                                    ("--gpu", gpu), ("--count", count), ("--name", name),
                                    ("--after", after))
                 if v is not None]
        if named or ctx.args:
            raise SpecError([("resume", f"--resume continues a job as it was defined; drop "
                              f"{', '.join(named) or 'the script arguments'}")])
        if remote() is not None:
            raise SpecError([("resume", "--resume works on this machine's own state; through "
                              "a server it is not available yet (gpufleet logout, on the "
                              "server's host, to resume there)")])
        st = store()
        job, on = submit.resume(st, resume, approve_quote(yes), cpu_slots, say=lambda note:
                                out.print(f"Resuming {resume}: {note}.", markup=False,
                                          highlight=False, soft_wrap=True), waiting=say)
        hand_over(st, job, on, detach, cpu_slots)
        return
    flags = {"name": name, "workers_per_node": workers_per_node, "strategy": strategy,
             "dp": dp, "tp": tp, "pp": pp, "pp_schedule": pp_schedule, "microbatches": microbatches,
             "precision": precision, "framework": framework, "max_restarts": max_restarts,
             "keep": keep or None, "hang_timeout": hang_timeout,
             "checkpoint_to": checkpoint_to, "workers": workers, "scale_up_util": scale_up_util,
             "scale_down_util": scale_down_util, "cooldown": cooldown,
             "scale_tolerance": scale_tolerance,
             "total_steps": total_steps, "loss_pattern": loss_pattern,
             "bootstrap": None if bootstrap else False, "priority": priority,
             "time_limit": time_limit, "after": after}
    inline = {"gpu": gpu, "count": count, "network": network, "disk": disk,
              "price_book": price_book, "nodes": nodes, "pool": pool}
    client = remote()
    if client is not None:
        from gpufleet.cli.remote_run import run_remote

        if dry_run:
            raise SpecError([("dry_run", "--dry-run plans on this machine's state; with a "
                              "server it is not available yet (gpufleet logout to plan here)")])
        data = job_data(file, script, list(ctx.args), env or [], flags, inline, cluster)
        run_remote(client, data, not no_queue, cpu_slots, detach)
        return
    st, spec = job_spec(file, script, list(ctx.args), env or [], flags, inline, cluster)
    approve, tell = warned_first(script_notes(spec), approve_quote(yes))
    if dry_run:
        dry = submit.submit(st, spec, approve, cpu_slots, dry_run=True)
        tell()
        assert not isinstance(dry, tuple)
        print_dry_run(dry)
        return
    import os

    from gpufleet.lifecycle import accounts, queued

    result = queued.run_or_queue(st, spec, accounts.local_identity(st), approve, cpu_slots,
                                 queue=not no_queue, environ=os.environ, say=say)
    tell()
    if isinstance(result, tuple):
        hand_over(st, *result, detach, cpu_slots)
        return
    from gpufleet.cli.follow import LocalSource, wait_and_follow
    from gpufleet.cli.queue import queued_headline, queued_message
    from gpufleet.server import local
    from gpufleet.store import gpufleet_home

    err.print(queued_headline(result), highlight=False)
    if local.running(gpufleet_home()) is None:  # its start takes seconds: say why we wait
        err.print("Starting the local queue server (the first queued job starts it; a few "
                  "seconds)...", highlight=False)
    local.ensure(gpufleet_home(), cpu_slots)
    queued_message(result.name, queued.entry(st, result.name), detach)
    if not detach:
        wait_and_follow(LocalSource(st), result.name)


@app.command(cls=COMMAND)
def logs(
    job: Annotated[str, typer.Argument(help="Job name.")],
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing until it ends; then exit as `run` does: 0 if it "
        "succeeded, 1 if not (130 after Ctrl-C, which leaves the job running).")] = False,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank's log.")] = None,
) -> None:
    """A job's output, every rank's lines prefixed by their rank, or one rank with --rank."""
    from gpufleet.lifecycle.status import CTRL_C_EXIT, exit_code

    client = remote()
    try:
        status = remote_logs(client, job, follow, rank) if client is not None else \
            _local_logs(job, follow, rank)
    except KeyboardInterrupt:  # leaving the log does not stop the job
        raise typer.Exit(CTRL_C_EXIT) from None
    if follow:
        raise typer.Exit(exit_code(status))


def _local_logs(job: str, follow: bool, rank: int | None) -> str:
    """Print the job's log (with `follow`, until the job ended and its log is read to the end);
    the job's status then."""
    from gpufleet.errors import NotFoundError
    from gpufleet.lifecycle import jobs, reconcile

    st = store()
    if jobs.get_or_none(st, job) is None:
        queued_first(st, job, follow)
    j = jobs.get(st, job)
    path = Path(j.job_dir) / ("job.log" if rank is None else f"logs/rank{rank}.log")
    if rank is not None and not 0 <= rank < j.world_size:
        raise NotFoundError(f"rank: job {job} has ranks 0..{j.world_size - 1}, not {rank}")
    pos = 0
    while True:
        if path.exists():
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
                pos += len(chunk)
            sys.stdout.write(chunk.decode("utf-8", "replace"))
            sys.stdout.flush()
        if not follow:
            return j.status
        j = reconcile.refresh(st, job)
        if j.status not in jobs.ACTIVE:
            if path.exists() and path.stat().st_size > pos:
                continue
            return j.status
        time.sleep(0.5)


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
    from gpufleet.snapshot import state_path
    from gpufleet.snapshot_job import job_detail as ended_job_detail

    # An ended job is read straight from the state file (see gpufleet.snapshot_job); any
    # other goes through the store, which first records a dead supervisor.
    client = remote()
    st: Store | None = None
    detail = ended_job_detail(state_path(), job, time.time()) if client is None else None
    if client is not None:
        detail = client.call("GET", f"/api/v1/jobs/{seg(job)}")
    if detail is None:
        from gpufleet.views import job_detail

        st = store()
        waiting = queue_row(st, job)
        detail = waiting if waiting is not None else job_detail(st, job, time.time())
    if "queued" in detail:  # no job record yet: its place in the queue
        print_queued(detail, as_json)
        return
    if as_json:
        print_json(detail)
        return
    from gpufleet import ui
    from gpufleet.lifecycle.status import JOB_ACTIVE

    follow = (watch or (out.is_terminal and not once)) and detail["status"] in JOB_ACTIVE
    if not follow:
        out.print(ui.status_view(detail))
        return
    from rich.live import Live

    from gpufleet.cli.terminal import unechoed
    from gpufleet.views import job_detail

    def fresh() -> dict[str, Any]:
        if client is not None:
            got: dict[str, Any] = client.call("GET", f"/api/v1/jobs/{seg(job)}")
            return got
        return job_detail(st or store(), job, time.time())

    try:
        with unechoed(out.file), Live(ui.status_view(detail), console=out,
                                      refresh_per_second=2) as live:
            while detail["status"] in JOB_ACTIVE:
                time.sleep(0.5 if client is None else 1.0)
                detail = fresh()
                live.update(ui.status_view(detail))
    except KeyboardInterrupt:  # leaving the view does not stop the job
        return

