"""Cluster commands: `launch`, `list`, `ssh`, `exec` and `stop`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.app import COMMAND, app, out, print_json, store
from gpufleet.cli.connect import client
from gpufleet.cli.options import (
    Backend,
    ClusterName,
    ClusterYaml,
    Count,
    CpuSlots,
    Disk,
    Gpu,
    Image,
    Json,
    Network,
    Nodes,
    PoolOpt,
    PriceBook,
    Spares,
    Yes,
    default,
)
from gpufleet.errors import SpecError
from gpufleet.slot_words import devices_shown

PASS_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command(cls=COMMAND)
def launch(
    gpu: Gpu = None,
    count: Count = None,
    network: Network = None,
    disk: Disk = None,
    name: ClusterName = None,
    nodes: Nodes = None,
    spares: Spares = None,
    backend: Backend = None,
    pool: PoolOpt = None,
    price_book: PriceBook = None,
    file: ClusterYaml = None,
    cpu_slots: CpuSlots = None,
    time_limit: Annotated[str | None, typer.Option(
        "--time-limit", help="How long the cluster may hold its nodes, e.g. 2h (a Slurm pool "
        "asks sbatch --time for it)." + default("the pool's own limit"))] = None,
    image: Image = None,
    yes: Yes = False,
    as_json: Json = False,
) -> None:
    """Carve a homogeneous cluster out of the pool: shows a quote, then reserves devices.

    On a Slurm pool the cluster is one Slurm allocation: the request waits in Slurm's queue,
    with Slurm's pending reason shown, and one it can never satisfy is refused at once."""
    from gpufleet.spec import load_yaml

    data: dict[str, Any] = load_yaml(file) if file else {}
    flags = {"gpu": gpu, "count": count, "network": network, "disk": disk, "name": name,
             "nodes": nodes, "spares": spares, "backend": backend, "pool": pool, "price_book": price_book,
             "time_limit": time_limit, "image": image}
    merged = {**data, **{k: v for k, v in flags.items() if v is not None}}
    got = client().launch(merged, yes, as_json, cpu_slots)
    if as_json:
        print_json(got.row)
        return
    out.print(f"Cluster [bold]{got.name}[/]: {devices_shown(got.gpu, got.count)}{got.placed}. "
              f"Run a job: gpufleet run --cluster {got.name} SCRIPT")


@app.command("list", cls=COMMAND)
def list_(
    all_: Annotated[bool, typer.Option("--all", "-a", help="Include stopped clusters.")] = False,
    as_json: Json = False,
) -> None:
    """Clusters with their devices, topology, health, status, $/hour, age and cost so far."""
    from rich.table import Table

    from gpufleet import ui

    rows = client().clusters(all_)
    if as_json:
        print_json(rows)
        return
    t = Table(title="Clusters", title_justify="left")
    for col in ("NAME", "GPU", "COUNT", "DEVICES", "TOPOLOGY", "HEALTH", "STATUS", "$/HOUR",
                "AGE", "COST", "JOB"):
        t.add_column(col, justify="right" if col in ("COUNT", "$/HOUR", "COST", "AGE") else "left",
                     no_wrap=col not in ("DEVICES", "JOB"))
    for r in rows:
        job = f"{r['job']} ({r['job_status']})" if r["job"] else "-"
        gpu_label = r["gpu"] + (" (sim)" if r.get("simulated") else "")
        spare = f" +{len(r['spares'])} spare" if r.get("spares") else ""  # billed in $/HOUR
        t.add_row(r["name"], gpu_label, f"{r['count']}{spare}", ",".join(r["devices"]) or "-",
                  r["topology"], r["health"], r["status"], ui.usd(r["usd_per_hour"]),
                  ui.duration(r["age_s"]), ui.usd(r["cost_usd"]), job)
    if not rows:
        t.caption = "No clusters. Create one: gpufleet launch --gpu cpu --count 2"
    out.print(t)


def _call(name: str, command: list[str], cwd: Path | None) -> int:
    from gpufleet.lifecycle.access import invocation

    inv = invocation(store(), name, command, cwd)
    try:
        code = subprocess.call(inv.argv, env=inv.env, cwd=inv.cwd)
    except OSError as exc:  # not found, not executable, ...
        raise SpecError([("command", f"cannot run {inv.argv[0]}: {exc.strerror or exc}")]) from None
    return 128 - code if code < 0 else code  # killed by signal N: 128+N, as a shell reports


@app.command(cls=COMMAND, context_settings=PASS_ARGS)
def ssh(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(
        help="Cluster name (its head node), or NAME-workerK for its K-th worker node.")],
) -> None:
    """A shell on a cluster node with its devices and environment (`-- CMD`: one command).

    On this machine (the local pool, a local Ray pool) a shell here with the node's settings;
    on another machine of a Ray pool, `ssh` to its address; on a Slurm pool, `srun --pty`
    into the node inside the cluster's allocation."""
    raise typer.Exit(_call(name, list(ctx.args), None))


@app.command("exec", cls=COMMAND, context_settings=PASS_ARGS)
def exec_(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Cluster name.")],
) -> None:
    """Run `-- CMD` in the current folder with the cluster's devices and environment."""
    if not ctx.args:
        raise SpecError([("command", "give the command after '--', e.g. gpufleet exec NAME -- "
                          "nvidia-smi")])
    raise typer.Exit(_call(name, list(ctx.args), Path.cwd()))


@app.command(cls=COMMAND)
def stop(
    name: Annotated[str | None, typer.Argument(help="Cluster or job name.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every running cluster.")] = False,
    yes: Yes = False,
) -> None:
    """Stop a job (its workers end) or a cluster (its job ends, its devices are freed).

    Asks first on a terminal (not with -y, nor when stdin is not a terminal); --all lists the
    clusters and jobs it stops."""
    if not name and not all_:
        raise SpecError([("name", "give a cluster or job name, or --all")])
    client().stop(name, all_, yes)
