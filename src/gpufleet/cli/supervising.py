"""What `run` shows while it hands a job over: warnings from a static look at the script, each
node's command for a dry run, then the job's supervisor, detached or in this process behind a
live view whose outcome is the exit code.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli.app import err, out, silence_stdout

if TYPE_CHECKING:
    from gpufleet.launch.script_scan import ScriptWarning
    from gpufleet.lifecycle.provision import Approve, Offer
    from gpufleet.lifecycle.submit import DryRun
    from gpufleet.spec import JobSpec
    from gpufleet.store import Cluster, Job, Store


def script_notes(spec: JobSpec) -> list[ScriptWarning]:
    """What a static look at the job's script finds the user should know (layout flags it will
    not apply); none when the script cannot be read."""
    from gpufleet.launch.script_scan import script_warnings

    try:
        source: str | None = (Path(spec.workdir or ".") / spec.script).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        source = None
    return script_warnings(spec, source)


def warned_first(notes: list[ScriptWarning], approve: Approve) -> tuple[Approve, Callable[[], None]]:
    """`approve` that prints the notes (one stderr line each) before the quote, and a `tell` that
    prints them if the quote never came (an existing cluster, a dry run): either way before the
    start, and never for a job refused at its checks (those fail before any quote)."""
    told = [False]

    def tell() -> None:
        if not told[0]:
            told[0] = True
            for note in notes:
                err.print(f"warning: {note.message}", markup=False, highlight=False,
                          soft_wrap=True, emoji=False)

    def first(offer: Offer) -> None:
        tell()
        approve(offer)

    return first, tell


def print_dry_run(dry: DryRun) -> None:
    """What `run` would start, node by node, without starting or reserving anything."""
    from gpufleet.launch import frameworks
    from gpufleet.launch.torchrun import JobContext
    from gpufleet.store import gpufleet_home

    spec, placements = dry.spec, dry.placements
    assert spec.name is not None
    job_dir = gpufleet_home() / "jobs" / spec.name
    ctx = JobContext(job_name=spec.name, cluster_name=dry.cluster, job_dir=job_dir,
                     report_addr="127.0.0.1:<report port>", fabric=dry.fabric, python=sys.executable,
                     host_cpus=os.cpu_count() or 1)
    if len(placements) > 1:  # what each node's agent runs (rendezvous on the head)
        head = placements[0].address
        commands = [(p.node_id, frameworks.build(spec, dry.layout, p, ctx, rdzv=frameworks.Rendezvous(
            len(placements), i, f"{head}:<port>", spec.name, p.address)))
            for i, p in enumerate(placements)]
    else:
        commands = [(p.node_id, frameworks.build(spec, dry.layout, p, ctx)) for p in placements]
    out.print(f"# dry run: job {spec.name}, {spec.framework}, {dry.layout.describe}", markup=False,
              highlight=False, emoji=False)
    caller = dict(os.environ) if dry.this_host else None  # a run here starts from this shell's
    out.print(frameworks.describe(commands, job_dir, caller, spec.env), markup=False,
              highlight=False, soft_wrap=True, emoji=False)
    if dry.engine_lines:  # Slurm: the allocation and the step that runs each node's command
        out.print("# Slurm: the allocation, then one step per node (each runs its node's "
                  "command above)\n" + "\n".join(dry.engine_lines), markup=False,
                  highlight=False, soft_wrap=True, emoji=False)


def hand_over(st: Store, job: Job, cluster: Cluster, detach: bool,
               cpu_slots: int | None = None) -> None:
    """Hand the job to its supervisor: a detached process, or this one with a live view; the
    exit code is the job's outcome."""
    from gpufleet.lifecycle import runs
    from gpufleet.status import exit_code

    if detach:
        runs.start_detached(st, job, cpu_slots)
        out.print(f"Job [bold]{job.name}[/] started on {cluster.name} in the background.\n"
                  f"  follow:  gpufleet logs {job.name} -f\n  status:  gpufleet status {job.name}"
                  f"\n  stop:    gpufleet stop {job.name}")
        return
    final, interrupted = _foreground(st, job, cluster, cpu_slots)
    raise typer.Exit(exit_code(final.status, ctrl_c=interrupted))


def _foreground(st: Store, job: Job, cluster: Cluster,
                cpu_slots: int | None = None) -> tuple[Job, bool]:
    """Supervise the job in this process with a live view; (final job, ended by Ctrl-C)."""
    from rich.live import Live

    from gpufleet import durable_copy, ui
    from gpufleet.cli.terminal import unechoed
    from gpufleet.lifecycle import jobs, runs

    last_line = [0.0]

    def on_line(rank: int | None, text: str) -> None:
        # rank 0 and the agent speak for the job; every rank's lines are in `gpufleet logs`
        if rank in (0, None):
            label = "agent" if rank is None else f"rank{rank}"
            out.print(f"[{label}] {text}", markup=False, highlight=False, soft_wrap=True,
                      emoji=False)

    if out.is_terminal:  # a live panel under the scrolling log lines, gone before the summary
        with unechoed(out.file), Live(console=out, refresh_per_second=4, transient=True) as live:
            final, sup = runs.supervise_here(st, job, cluster, cpu_slots,
                                      on_tick=lambda v: live.update(ui.job_panel(v)),
                                      on_line=on_line)
    else:  # logs and a progress line every 10 s
        def on_tick(v: Any) -> None:
            if v.step is not None and time.time() - last_line[0] >= 10:
                last_line[0] = time.time()
                out.print(ui.progress_line(v), markup=False, highlight=False)

        final, sup = runs.supervise_here(st, job, cluster, cpu_slots, on_tick=on_tick,
                                         on_line=on_line)
    try:
        out.print(ui.summary_table(sup.view()))
        copy = durable_copy.state((e.kind, e.reason) for e in jobs.events(st, final.id))
        if copy is not None:
            out.print(ui.durable_line(copy.as_dict()))
        out.print(f"Logs: gpufleet logs {final.name}   (per rank: {final.job_dir}/logs)")
    except BrokenPipeError:  # `gpufleet run ... | head`: the job's outcome still sets the exit code
        silence_stdout()
    return final, sup.interrupted
