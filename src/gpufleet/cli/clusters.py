"""Cluster commands: `launch`, `list`, `ssh`, `exec` and `stop`."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpufleet.cli.app import (
    COMMAND,
    app,
    approve_quote,
    confirm,
    out,
    print_json,
    remote,
    say,
    store,
)
from gpufleet.cli.options import (
    Backend,
    ClusterName,
    ClusterYaml,
    Count,
    CpuSlots,
    Disk,
    Gpu,
    Json,
    Network,
    Nodes,
    PoolOpt,
    PriceBook,
    Yes,
    default,
)
from gpufleet.errors import SpecError
from gpufleet.server.seg import seg
from gpufleet.slot_words import devices_shown, network_shown

if TYPE_CHECKING:
    from gpufleet.lifecycle.runs import StopPlan

PASS_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command(cls=COMMAND)
def launch(
    gpu: Gpu = None,
    count: Count = None,
    network: Network = None,
    disk: Disk = None,
    name: ClusterName = None,
    nodes: Nodes = None,
    backend: Backend = None,
    pool: PoolOpt = None,
    price_book: PriceBook = None,
    file: ClusterYaml = None,
    cpu_slots: CpuSlots = None,
    time_limit: Annotated[str | None, typer.Option(
        "--time-limit", help="How long the cluster may hold its nodes, e.g. 2h (a Slurm pool "
        "asks sbatch --time for it)." + default("the pool's own limit"))] = None,
    yes: Yes = False,
    as_json: Json = False,
) -> None:
    """Carve a homogeneous cluster out of the pool: shows a quote, then reserves devices.

    On a Slurm pool the cluster is one Slurm allocation: the request waits in Slurm's queue,
    with Slurm's pending reason shown, and one it can never satisfy is refused at once."""
    from gpufleet.lifecycle import clusters
    from gpufleet.lifecycle.provision import provision, with_pool
    from gpufleet.spec import ClusterSpec, load_yaml
    from gpufleet.views import cluster_rows, pool_nodes

    data: dict[str, Any] = load_yaml(file) if file else {}
    flags = {"gpu": gpu, "count": count, "network": network, "disk": disk, "name": name,
             "nodes": nodes, "backend": backend, "pool": pool, "price_book": price_book,
             "time_limit": time_limit}
    merged = {**data, **{k: v for k, v in flags.items() if v is not None}}
    client = remote()
    if client is not None:  # the server checks it against its own pools
        got = client.call("POST", "/api/v1/clusters", {"spec": merged})
        if as_json:
            print_json(got)
            return
        out.print(f"Cluster [bold]{got['name']}[/]: {devices_shown(got['gpu'], got['count'])} on "
                  f"{client.url}. Run a job: gpufleet run --cluster {got['name']} SCRIPT")
        return
    st = store()
    spec = ClusterSpec.parse(with_pool(st, merged))
    cluster = provision(st, spec, approve_quote(yes, quiet=as_json), cpu_slots, say=say)
    if as_json:
        print_json(cluster_rows(st, [cluster], time.time(), pool_nodes(st, cpu_slots))[0])
        return
    where = "; ".join(f"{p.node_id}: {','.join(d.id for d in p.devices)}"
                      for p in clusters.placements(st, cluster))
    sim = " (simulated, not billed)" if cluster.simulated else ""
    out.print(f"Cluster [bold]{cluster.name}[/]: {devices_shown(cluster.gpu, cluster.count)}{sim} "
              f"on {cluster.nodes} node(s) ({where}) over "
              f"{network_shown(cluster.gpu, cluster.network)}. "
              f"Run a job: gpufleet run --cluster {cluster.name} SCRIPT")


def local_rows(every: bool) -> list[dict[str, Any]]:
    """`list`'s rows on this machine: read straight from the state file when nothing needs the
    store's upkeep or a pool's devices (see `gpufleet.snapshot`), else through the store."""
    from gpufleet.snapshot import cluster_rows as quick_rows
    from gpufleet.snapshot import state_path

    now = time.time()
    quick = quick_rows(state_path(), every, now)
    if quick is not None:
        return quick
    from sqlalchemy import select

    from gpufleet.lifecycle.status import CLUSTER_ACTIVE
    from gpufleet.store import Cluster
    from gpufleet.views import cluster_rows, pool_nodes

    st = store()
    q = select(Cluster).order_by(Cluster.id)
    if not every:
        q = q.where(Cluster.status.in_(CLUSTER_ACTIVE))
    with st.read() as s:
        found = list(s.scalars(q).all())
    return cluster_rows(st, found, now, pool_nodes(st))


@app.command("list", cls=COMMAND)
def list_(
    all_: Annotated[bool, typer.Option("--all", "-a", help="Include stopped clusters.")] = False,
    as_json: Json = False,
) -> None:
    """Clusters with their devices, topology, health, status, $/hour, age and cost so far."""
    from rich.table import Table

    from gpufleet import ui

    client = remote()
    if client is not None:  # yours on the server (every one for an admin), the same rows
        rows = client.call("GET", "/api/v1/clusters", query={"all": str(all_).lower()})
    else:
        rows = local_rows(all_)
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
        t.add_row(r["name"], gpu_label, str(r["count"]), ",".join(r["devices"]) or "-",
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


def _nothing_running() -> bool:
    """True when the state file shows no running cluster and no active job: `stop --all` then
    has nothing to do and answers without opening the store (a second of CPU on a small
    machine). Anything the quick reader cannot vouch for goes through the store."""
    from gpufleet.snapshot import cluster_rows as quick_rows
    from gpufleet.snapshot import state_path

    path = state_path()
    if (path.parent / "server.json").exists():  # a local server to end: through the store
        return False
    return quick_rows(path, False, time.time()) == []


def _end_idle_server() -> None:
    """After `stop --all` nothing is queued or running: the local server (if one runs) has
    nothing left to do, so it is ended now rather than when its idle time runs out."""
    import os
    import signal

    from gpufleet.home import home_path
    from gpufleet.server import local

    info = local.running(home_path())
    if info is not None:
        try:
            os.kill(int(info["pid"]), signal.SIGTERM)
        except ProcessLookupError:
            pass


def _describe(plan: StopPlan) -> list[str]:
    """One line per cluster a stop ends, with the job running on it."""
    lines = []
    for c, job in plan.clusters:
        running = f", job {job.name} ({job.status})" if job is not None else ""
        lines.append(f"  {c.name}: {devices_shown(c.gpu, c.count)}{running}")
    return lines


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
    client = remote()
    if client is not None:
        if all_ or not name:
            raise SpecError([("all", "with a server, stop jobs by name (gpufleet jobs lists "
                              "yours); --all stops this machine's own clusters after logout")])
        from gpufleet.errors import NotFoundError

        confirm(f"Stop {name}?", yes)
        try:
            got = client.call("POST", f"/api/v1/jobs/{seg(name)}/stop")
            out.print(f"Job {name}: {got['status']}")
        except NotFoundError:  # not a job: a cluster of yours on the server
            got = client.call("DELETE", f"/api/v1/clusters/{seg(name)}")
            out.print(f"Cluster {name}: {got.get('status', 'stopped')}, devices freed, cost "
                      f"${got['cost_usd']:.4f}")
        return
    if all_ and not name and _nothing_running():
        out.print("No running clusters.")
        return
    from gpufleet.lifecycle import accounts, queued, runs

    st = store()
    waiting = queued.entry(st, name) if name else None
    if waiting is not None and waiting.status == "queued":
        confirm(f"Cancel job {name} (queued)?", yes)
        queued.cancel(st, waiting.name, accounts.local_identity(st))
        out.print(f"Job {name}: cancelled (it was queued)")
        return
    if all_:
        for e in queued.waiting(st):  # or they would start on the devices this frees
            queued.cancel(st, e.name, accounts.local_identity(st))
            out.print(f"Job {e.name}: cancelled (it was queued)")
    plan = runs.plan_stop(st, name, every=all_)
    if plan.already_stopped:
        out.print(f"Cluster {name} is already stopped.")
        return
    if plan.job is not None:
        confirm(f"Stop job {plan.job.name} ({plan.job.status})?", yes)
        out.print(f"Job {plan.job.name}: {runs.stop_job(st, plan.job).status}")
        return
    if all_:
        if not plan.clusters:
            out.print("No running clusters.")
            _end_idle_server()
            return
        out.print(f"Stopping {len(plan.clusters)} running cluster(s):", highlight=False)
        for line in _describe(plan):
            out.print(line, markup=False, highlight=False)
        confirm(f"Stop {len(plan.clusters)} cluster(s)?", yes)
    else:
        c, job = plan.clusters[0]
        running = f", its job {job.name} ends" if job is not None else ""
        confirm(f"Stop cluster {c.name} ({devices_shown(c.gpu, c.count)}{running})?", yes)
    for c, _job in plan.clusters:
        stopped, spent = runs.stop_cluster(st, c, say=say)
        out.print(f"Cluster {stopped.name}: {stopped.status}, devices freed, cost ${spent:.4f}")
    if all_:
        _end_idle_server()
