"""The `gpufleet` command: one thin verb per task, all input through `spec`, all state in `store`.

Errors a user can cause are `GpufleetError`s: printed as one line, exit code 2. torch is never
imported here; only the training processes import it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text
from sqlalchemy import select

from gpufleet import catalog
from gpufleet.errors import AllocationError, ConflictError, GpufleetError, NotFoundError, SpecError
from gpufleet.lifecycle import clusters
from gpufleet.parallelism import Layout
from gpufleet.plan import cost
from gpufleet.pool.model import Placement
from gpufleet.spec import ClusterSpec, JobSpec, load_yaml
from gpufleet.store import Cluster, Job, Store

app = typer.Typer(
    help="Carve GPU clusters out of this machine's pool and run distributed training on them.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)
# Piped output (scripts, `| grep`) gets wide lines instead of rich's 80-column default.
out = Console(width=None if Console().is_terminal else 160)
err = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 160)

Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
CpuSlots = Annotated[int | None, typer.Option(
    "--cpu-slots", help="CPU worker slots this host offers [default: $GPUFLEET_CPU_SLOTS or cores]")]


def _cluster_backend(store: Store, cluster: Cluster, cpu_slots: int | None = None) -> Any:
    """The backend of the pool the cluster was carved from."""
    from gpufleet.lifecycle import pools

    return pools.backend_for(pools.pool_of(store, cluster), cpu_slots)


def _with_pool(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    """A cluster spec's `pool` and `backend` resolved against the store: the named pool, the
    only pool of the named kind, or the default pool."""
    from gpufleet.lifecycle import pools

    row = pools.resolve(store, data.get("pool"), data.get("backend"))
    return {**data, "pool": row.name if row else None, "backend": row.kind if row else "local"}


def _store() -> Store:
    from gpufleet.lifecycle import jobs

    store = Store()
    jobs.reconcile(store)
    return store


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _confirm(question: str, yes: bool) -> None:
    if yes or not sys.stdin.isatty():
        return
    if not typer.confirm(question, default=True):
        raise typer.Exit(1)


# -- prices --------------------------------------------------------------------------------------
def _prices(gpu: str | None, as_json: bool) -> None:
    wanted = catalog.resolve_gpu(gpu).name if gpu else None
    rows = []
    for g in catalog.gpu_types().values():
        if wanted and g.name != wanted:
            continue
        per_book = {b: catalog.price_of(b, g.name) for b in catalog.price_books()}
        rows.append((g, per_book))
    if as_json:
        _print_json([{
            "gpu": g.name, "memory_gb": g.memory_gb, "bf16": g.bf16,
            "bf16_tflops": g.bf16_tflops, "fp32_tflops": g.fp32_tflops,
            "mem_bw_gbps": g.mem_bw_gbps,
            "usd_per_gpu_hour": {b: p.usd_per_gpu_hour if p else None for b, p in books.items()},
        } for g, books in rows])
        return
    t = Table(title="GPU types and prices ($ per GPU-hour)", title_justify="left")
    for col in ("GPU", "memory", "BF16", "BF16 TFLOPS", "FP32 TFLOPS", "mem GB/s",
                *catalog.price_books()):
        t.add_column(col, justify="left" if col in ("GPU", "BF16") else "right",
                     min_width=len(col) if col in catalog.price_books() or col == "GPU" else None,
                     no_wrap=col == "GPU")
    for g, books in rows:
        t.add_row(g.name, f"{g.memory_gb:g} GB" if g.memory_gb else "host",
                  "yes" if g.bf16 else "no", f"{g.bf16_tflops:g}" if g.bf16_tflops else "-",
                  f"{g.fp32_tflops:g}" if g.fp32_tflops else "-",
                  f"{g.mem_bw_gbps:g}" if g.mem_bw_gbps else "-",
                  *(f"{p.usd_per_gpu_hour:.4g}" if p else "-" for p in books.values()))
    premiums = [p for p in catalog.prices() if p.kind == "interconnect"]
    t.caption = "Network premiums per GPU-hour: " + ", ".join(
        f"{p.item} +${p.usd_per_gpu_hour:.2f} ({p.book})" for p in premiums
    ) + ". Sources: gpufleet/catalog/data/*.csv"
    out.print(t)


@app.command()
def prices(
    gpu: Annotated[str | None, typer.Option("--gpu", help="Only this GPU type.")] = None,
    as_json: Json = False,
) -> None:
    """GPU types, their specs and $/GPU-hour under each price book."""
    _prices(gpu, as_json)


@app.command("show-gpus", hidden=False)
def show_gpus(
    gpu: Annotated[str | None, typer.Option("--gpu", help="Only this GPU type.")] = None,
    as_json: Json = False,
) -> None:
    """Alias of `prices`."""
    _prices(gpu, as_json)


# -- plan ----------------------------------------------------------------------------------------
@app.command()
def plan(
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="A catalog model (--list-models).")] = None,
    params: Annotated[float | None, typer.Option("--params", help="A bare size, e.g. 7e9.")] = None,
    config: Annotated[str | None, typer.Option("--config", help="A Hugging Face config.json.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU type of the cluster.")] = None,
    count: Annotated[int | None, typer.Option("--count", help="GPUs [default: 1].")] = None,
    network: Annotated[str | None, typer.Option(
        "--network", help="pcie, nvlink, nvswitch, infiniband or ethernet [default: the GPU's "
        "node fabric; infiniband above 8 GPUs].")] = None,
    strategy: Annotated[str | None, typer.Option(
        "--strategy", help="ddp, fsdp, zero1, zero2, zero3, tp or pp [default: ddp].")] = None,
    dp: Annotated[int | None, typer.Option("--dp", help="Data-parallel degree.")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="Tensor-parallel degree.")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Pipeline stages.")] = None,
    pp_schedule: Annotated[str | None, typer.Option("--pp-schedule", help="gpipe or 1f1b.")] = None,
    microbatches: Annotated[int | None, typer.Option(
        "--microbatches", help="Pipeline micro-batches per step [default: --pp].")] = None,
    precision: Annotated[str | None, typer.Option(
        "--precision", help="fp32, bf16-mixed or fp16-mixed [default: bf16-mixed].")] = None,
    framework: Annotated[str | None, typer.Option(
        "--framework", help="torchrun, accelerate, deepspeed, ray or horovod [default: torchrun].")] = None,
    micro_batch: Annotated[int | None, typer.Option(
        "--micro-batch", help="Samples per GPU per micro-batch [default: 1].")] = None,
    seq: Annotated[int | None, typer.Option(
        "--seq", help="Tokens per sample [default: 2048, or the model's limit].")] = None,
    grad_accum: Annotated[int | None, typer.Option(
        "--grad-accum", help="Micro-batches per optimizer step [default: 1].")] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Samples to train on.")] = None,
    lora: Annotated[bool, typer.Option("--lora", help="LoRA fine-tuning (frozen base).")] = False,
    lora_rank: Annotated[int | None, typer.Option("--lora-rank", help="LoRA rank [default: 16].")] = None,
    checkpointing: Annotated[bool, typer.Option(
        "--checkpointing", help="Full activation checkpointing (recompute each layer).")] = False,
    attention: Annotated[str | None, typer.Option(
        "--attention", help="flash (fused, the default) or eager.")] = None,
    sequence_parallel: Annotated[bool, typer.Option(
        "--sequence-parallel", help="Megatron sequence parallelism with tp.")] = False,
    calibration: Annotated[str | None, typer.Option(
        "--calibration", help="A file from `gpufleet bench`, used instead of catalog rates.")] = None,
    deadline: Annotated[str | None, typer.Option(
        "--deadline", help="Rank every cluster finishing within this (e.g. 24h), cheapest first.")] = None,
    budget: Annotated[float | None, typer.Option(
        "--budget", help="Rank every cluster that costs at most this many dollars.")] = None,
    top: Annotated[int | None, typer.Option("--top", help="Rows of a ranking [default: 10].")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Also draw a PNG here.")] = None,
    list_models: Annotated[bool, typer.Option("--list-models", help="List catalog models.")] = False,
    as_json: Json = False,
) -> None:
    """Memory, speed and cost of training a model before you rent GPUs; or rank every cluster
    against a --deadline or --budget."""
    from gpufleet.plan import command
    from gpufleet.spec import PlanSpec

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


# -- clusters ------------------------------------------------------------------------------------
def _launch(store: Store, spec: ClusterSpec, yes: bool, cpu_slots: int | None,
            for_job: str | None = None, quiet: bool = False) -> Cluster:
    from gpufleet import ui
    from gpufleet.lifecycle import pools

    pool = pools.resolve(store, spec.pool, spec.backend)
    nodes = pools.backend_for(pool, cpu_slots).discover()
    # refuse before quoting what cannot be had
    try:
        alloc = clusters.check(store, spec, nodes, pool.name if pool else None)
    except AllocationError as exc:
        if pool is None:
            raise
        raise AllocationError(f"{exc} [pool {pool.name}; this host's devices: --pool local, or "
                              "gpufleet pool use local]") from None
    network = clusters.network_of(spec, alloc, nodes)
    q = clusters.quote_for(spec, network, clusters.is_simulated(alloc))
    if not quiet:
        err.print(ui.quote_table(spec.gpu, spec.count, network, q.rates, q.book))
        if q.simulated:
            err.print(f"Simulated devices (pool {pool.name if pool else 'local'}): not billed; "
                      "the quote is what real ones would cost.")
    _confirm(f"Launch {spec.count} x {spec.gpu} at {ui.usd(q.usd_per_hour)}/hour?", yes)
    return clusters.launch(store, spec, nodes, for_job=for_job, pool=pool.name if pool else None)


@app.command()
def launch(
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="GPU type, e.g. H100, A100, RTX4090, cpu (required here or in -f).")] = None,
    count: Annotated[int | None, typer.Option("--count", help="Number of GPUs (1-128) [default: 1].")] = None,
    network: Annotated[str | None, typer.Option(
        "--network", help="pcie, nvlink, nvswitch, infiniband or ethernet.")] = None,
    disk: Annotated[str | None, typer.Option(
        "--disk", help="Scratch space, e.g. 100GB, 1TB [default: 1GB].")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Cluster name (DNS-like).")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", help="Nodes to spread over.")] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", help="local, ray or sim: the only pool of that kind.")] = None,
    pool: Annotated[str | None, typer.Option(
        "--pool", help="Pool to carve from [default: the default pool, see gpufleet pool list]."
    )] = None,
    price_book: Annotated[str | None, typer.Option(
        "--price-book", help="Bill under this book [default: cheapest offering the GPU].")] = None,
    file: Annotated[Path | None, typer.Option("-f", "--file", help="Cluster YAML.")] = None,
    cpu_slots: CpuSlots = None,
    yes: Yes = False,
    as_json: Json = False,
) -> None:
    """Carve a homogeneous cluster out of the pool: shows a quote, then reserves devices."""
    data: dict[str, Any] = load_yaml(file) if file else {}
    flags = {"gpu": gpu, "count": count, "network": network, "disk": disk, "name": name,
             "nodes": nodes, "backend": backend, "pool": pool, "price_book": price_book}
    store = _store()
    merged = {**data, **{k: v for k, v in flags.items() if v is not None}}
    spec = ClusterSpec.parse(_with_pool(store, merged))
    cluster = _launch(store, spec, yes, cpu_slots, quiet=as_json)
    if as_json:
        _print_json(_cluster_dict(store, cluster, time.time(),
                                  _cluster_backend(store, cluster, cpu_slots).discover()))
        return
    where = "; ".join(f"{p.node_id}: {','.join(d.id for d in p.devices)}"
                      for p in clusters.placements(store, cluster))
    sim = " (simulated, not billed)" if cluster.simulated else ""
    out.print(f"Cluster [bold]{cluster.name}[/]: {cluster.count} x {cluster.gpu}{sim} on "
              f"{cluster.nodes} node(s) ({where}) over {cluster.network}. "
              f"Run a job: gpufleet run --cluster {cluster.name} SCRIPT")


def _cluster_dict(store: Store, c: Cluster, now: float, nodes: list[Any] | None) -> dict[str, Any]:
    """What the dashboard shows of a cluster, plus its health against the devices seen now
    (None: the pool could not be reached)."""
    from gpufleet.web import data

    row = data.cluster_dict(store, c, now)
    health = clusters.health(c, clusters.placements(store, c), nodes) if nodes is not None \
        else "unknown: pool unreachable"
    return {**row, "topology": c.network, "age_s": now - c.created_at, "health": health,
            "pool": c.pool or "local", "nodes": c.nodes, "simulated": bool(c.simulated)}


def _pool_nodes(store: Store, c: Cluster, seen: dict[str | None, list[Any] | None]) -> list[Any] | None:
    """The nodes of a running cluster's pool, discovered once per pool per command."""
    if c.status not in clusters.ACTIVE:
        return []
    if c.pool not in seen:
        try:
            seen[c.pool] = _cluster_backend(store, c).discover()
        except GpufleetError:
            seen[c.pool] = None
    return seen[c.pool]


@app.command("list")
def list_(
    all_: Annotated[bool, typer.Option("--all", "-a", help="Include stopped clusters.")] = False,
    as_json: Json = False,
) -> None:
    """Clusters with their devices, topology, health, status, $/hour, age and cost so far."""
    from gpufleet import ui

    store = _store()
    now = time.time()
    q = select(Cluster).order_by(Cluster.id)
    if not all_:
        q = q.where(Cluster.status.in_(clusters.ACTIVE))
    with store.session() as s:
        found = list(s.scalars(q).all())
    seen_nodes: dict[str | None, list[Any] | None] = {}
    rows = [_cluster_dict(store, c, now, _pool_nodes(store, c, seen_nodes)) for c in found]
    if as_json:
        _print_json(rows)
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


def _node_preset(store: Store, cluster: Cluster, node: int) -> tuple[dict[str, str], str]:
    """What a job on the cluster's `node`-th node would get (devices pinned, presets), and the
    node's address."""
    from gpufleet.launch.env import device_env
    from gpufleet.launch.multinode import node_names

    placements = clusters.placements(store, cluster)
    p = placements[node]
    preset = device_env(p, cluster.network, os.cpu_count() or 1)
    return {**preset, "GPUFLEET_CLUSTER": cluster.name,
            "GPUFLEET_NODE": node_names(len(placements))[node]}, p.address


def _target(store: Store, name: str) -> tuple[Cluster, int]:
    """`big` is the head node of cluster big, `big-worker2` its third node."""
    import re

    try:
        return clusters.get(store, name), 0
    except NotFoundError:
        m = re.fullmatch(r"(.+)-worker(\d+)", name)
        if m is None:
            raise
    cluster = clusters.get(store, m.group(1))
    k = int(m.group(2))
    if not 1 <= k < cluster.nodes:
        last = f"{cluster.name}-worker{cluster.nodes - 1}" if cluster.nodes > 1 else "none"
        raise NotFoundError(f"node: cluster {cluster.name} has {cluster.nodes} node(s): "
                            f"{cluster.name} (head), workers up to {last}")
    return cluster, k


def _here(address: str) -> bool:
    """Whether `address` is this machine (loopback, or one of its interfaces)."""
    import psutil

    from gpufleet.backends.ray import is_loopback

    if is_loopback(address):
        return True
    return any(a.address == address for addrs in psutil.net_if_addrs().values() for a in addrs)


def _run_in_cluster(name: str, command: list[str], cwd: Path | None) -> int:
    import shlex

    from gpufleet.launch.torchrun import merge_env

    store = _store()
    cluster, node = _target(store, name)
    if cluster.status not in clusters.ACTIVE:
        raise ConflictError(f"cluster: '{cluster.name}' is {cluster.status}; launch it again to "
                            "use it")
    if cluster.backend == "sim":
        raise ConflictError(f"cluster: '{cluster.name}' is on a simulated pool; it has no "
                            "machine to reach")
    preset, address = _node_preset(store, cluster, node)
    argv = command or [os.environ.get("SHELL") or "/bin/bash"]
    env = merge_env(dict(os.environ), preset, {})
    if not _here(address):  # another machine of a Ray pool: over ssh, with the same settings
        remote = ["env", *(f"{k}={v}" for k, v in sorted(preset.items())), *argv]
        argv, env = ["ssh", "-t", address, shlex.join(remote)], dict(os.environ)
    try:
        code = subprocess.call(argv, env=env, cwd=cwd or Path(cluster.scratch_dir))
    except OSError as exc:  # not found, not executable, ...
        raise SpecError([("command", f"cannot run {argv[0]}: {exc.strerror or exc}")]) from None
    return 128 - code if code < 0 else code  # killed by signal N: 128+N, as a shell reports


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(
        help="Cluster name (its head node), or NAME-workerK for its K-th worker node.")],
) -> None:
    """A shell on a cluster node with its devices and environment (`-- CMD`: one command).

    On this machine (the local pool, a local Ray pool) a shell here with the node's settings;
    on another machine of a Ray pool, `ssh` to its address."""
    raise typer.Exit(_run_in_cluster(name, list(ctx.args), None))


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Cluster name.")],
) -> None:
    """Run `-- CMD` in the current folder with the cluster's devices and environment."""
    if not ctx.args:
        raise SpecError([("command", "give the command after '--', e.g. gpufleet exec NAME -- "
                          "nvidia-smi")])
    raise typer.Exit(_run_in_cluster(name, list(ctx.args), Path.cwd()))


# -- pools ---------------------------------------------------------------------------------------
pool_app = typer.Typer(help="Pools of nodes: this host, Ray clusters, synthetic pools.",
                       no_args_is_help=True)
app.add_typer(pool_app, name="pool")
LIST_NODES_UP_TO = 64  # larger pools are listed as groups of alike nodes


@pool_app.command("add")
def pool_add(
    kind: Annotated[str, typer.Argument(help="ray (an existing Ray cluster) or sim (synthetic).")],
    address: Annotated[str | None, typer.Option(
        "--address", help="ray: the head's HOST:PORT (as for `ray start --address`).")] = None,
    shape: Annotated[list[str] | None, typer.Option(
        "--shape", help="sim: NODESxGPU:PER_NODE[:NETWORK], repeatable, e.g. 1000xH100:8")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Pool name [default: the kind].")] = None,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="ray: the cluster's auth token (`ray get-auth-token` on the head) "
        "(else $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); a copy is "
        "kept with the pool.")] = None,
    no_default: Annotated[bool, typer.Option(
        "--no-default", help="Keep the current default pool.")] = False,
) -> None:
    """Register a pool; it becomes the default for launch and run unless --no-default."""
    from gpufleet.backends import ray_auth, sim
    from gpufleet.lifecycle import pools
    from gpufleet.store import gpufleet_home

    if kind not in ("ray", "sim"):
        raise SpecError([("kind", f"'{kind}' is not allowed; allowed: ray, sim (this host is "
                          "the built-in pool 'local')")])
    store = _store()
    pool_name = pools.check_name_field(name or kind)
    if kind == "ray":
        if address is None or shape:
            raise SpecError([("address", "a Ray pool needs --address HOST:PORT (and no --shape)")])
        pools.check_address(address)
        pools.check_free_name(store, pool_name)
        from gpufleet.backends.ray import RayBackend

        given = ray_auth.given_token(token_file, os.environ, Path.home())
        path = None if given is None else ray_auth.save_token(
            ray_auth.pool_token_path(gpufleet_home(), pool_name), given.token)
        try:  # reachable, the token accepted, and what it has
            found = RayBackend(pool_name, address, path,
                               token_source=given.source if given else None,
                               adding=True).discover()
            pools.add(store, pool_name, "ray", address,
                      {"token_file": str(path)} if path else {}, not no_default)
        except BaseException:
            if path is not None:
                ray_auth.forget(path)
            raise
        live = sum(1 for n in found if n.healthy)
        out.print(f"Pool [bold]{pool_name}[/]: Ray cluster at {address}, {live} live node(s), "
                  f"{sum(len(n.devices) for n in found if n.healthy)} device(s).")
    else:
        if address is not None or token_file is not None:
            field = "address" if address is not None else "token_file"
            raise SpecError([(field, f"a sim pool has no {field.replace('_', ' ')}; give --shape")])
        shapes = sim.parse_shapes(shape or [])
        pools.add(store, pool_name, "sim", None, {"shapes": [x.text() for x in shapes]},
                  not no_default)
        out.print(f"Pool [bold]{pool_name}[/]: simulated, {sum(x.nodes for x in shapes)} nodes, "
                  f"{sum(x.nodes * x.per_node for x in shapes)} devices.")
    if not no_default:
        out.print("It is now the default pool (back to this host: gpufleet pool use local).")


@pool_app.command("up")
def pool_up(
    local: Annotated[bool, typer.Option("--local", help="Start a Ray cluster on this machine.")] = False,
    nodes: Annotated[int, typer.Option("--nodes", help="Raylets: a head and workers.")] = 3,
    gpu: Annotated[str, typer.Option(
        "--gpu", help="Simulated GPU type each node declares (cpu: plain CPU slots).")] = "H100",
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="Devices per node.")] = 2,
    fabric: Annotated[str | None, typer.Option(
        "--fabric", help="pcie, nvlink or nvswitch inside a node [default: the type's own].")] = None,
    network: Annotated[str, typer.Option(
        "--network", help="infiniband or ethernet between nodes.")] = "infiniband",
    name: Annotated[str, typer.Option("--name", help="Pool name.")] = "local-ray",
    no_default: Annotated[bool, typer.Option(
        "--no-default", help="Keep the current default pool.")] = False,
) -> None:
    """Start a real multi-node Ray cluster here (one raylet per node on its own 127.x address)
    whose nodes declare simulated GPUs that run as CPU workers with gloo, and add it as a pool."""
    from gpufleet.backends import ray_auth, ray_local
    from gpufleet.backends.local import free_port
    from gpufleet.lifecycle import pools
    from gpufleet.pool.model import FABRIC_LEVEL
    from gpufleet.store import gpufleet_home

    problems = []
    if not local:
        problems.append(("local", "only --local is supported: it starts a Ray cluster here; "
                         "for an existing one use gpufleet pool add ray --address HOST:PORT"))
    if not 1 <= nodes <= 16:
        problems.append(("nodes", f"got {nodes}; must be 1 to 16 on one machine"))
    if not 1 <= gpus_per_node <= 8:
        problems.append(("gpus_per_node", f"got {gpus_per_node}; must be 1 to 8"))
    try:
        gtype = catalog.resolve_gpu(gpu)
    except SpecError as exc:
        problems += exc.problems
        gtype = None
    if fabric is not None and fabric not in FABRIC_LEVEL:
        problems.append(("fabric", f"'{fabric}' is not allowed; allowed: "
                         f"{', '.join(FABRIC_LEVEL)}"))
    if network not in ("infiniband", "ethernet"):
        problems.append(("network", f"'{network}' is not allowed; allowed: infiniband, ethernet"))
    if problems:
        raise SpecError(problems)
    assert gtype is not None
    store = _store()
    pools.check_name_field(name)
    pools.check_free_name(store, name)
    head_ip = f"{ray_local.subnet_for(name)}.1"
    cfg = ray_local.LocalRay(
        name=name, nodes=nodes, gpu=gtype.name, per_node=gpus_per_node,
        fabric=fabric or ("pcie" if gtype.is_cpu else gtype.node_fabric), network=network,
        head_ip=head_ip, port=free_port(head_ip),
        token_file=str(ray_auth.pool_token_path(gpufleet_home(), name)))
    started = time.monotonic()
    ray_local.start(cfg, on_node=lambda node, ip: err.print(
        f"  started {node} at {ip} ({time.monotonic() - started:.1f} s)"))
    try:
        ray_local.wait_nodes(cfg)
        pools.add(store, name, "ray", cfg.address, json.loads(cfg.to_json()), not no_default,
                  managed=True)
    except BaseException:
        ray_local.stop(cfg)
        raise
    sim = "" if gtype.is_cpu else " simulated"
    out.print(f"Pool [bold]{name}[/]: Ray cluster at {cfg.address}, {nodes} node(s) x "
              f"{gpus_per_node}{sim} {gtype.name} over {cfg.fabric}, {network} between nodes "
              f"({time.monotonic() - started:.1f} s){'' if no_default else ', now the default pool'}."
              f" Stop it: gpufleet pool down {name}")


@pool_app.command("down")
def pool_down(name: Annotated[str, typer.Argument(help="A pool started by pool up --local.")]) -> None:
    """Stop a local Ray cluster started by `pool up --local` and forget the pool."""
    from gpufleet.backends import ray_local
    from gpufleet.lifecycle import pools

    store = _store()
    pool = pools.get(store, name)
    if not pool.managed:
        raise ConflictError(f"pool: '{name}' was not started by gpufleet; forget it with "
                            f"gpufleet pool remove {name} (its Ray cluster is left running)")
    pools.remove(store, name)
    ended = ray_local.stop(ray_local.LocalRay.from_json(pool.spec_json))
    out.print(f"Pool {name} stopped ({ended} Ray process(es) ended).")


@pool_app.command("remove")
def pool_remove(name: Annotated[str, typer.Argument(help="Pool name.")]) -> None:
    """Forget a pool. A Ray cluster it points to keeps running, unless `pool up --local`
    started it: that one is stopped too."""
    from gpufleet.lifecycle import pools

    pool = pools.remove(_store(), name)
    if pool.managed:
        from gpufleet.backends import ray_local

        ray_local.stop(ray_local.LocalRay.from_json(pool.spec_json))
    out.print(f"Pool {name} removed.")


@pool_app.command("use")
def pool_use(name: Annotated[str, typer.Argument(help="Pool name, or local for this host.")]) -> None:
    """Make a pool the default for launch and run."""
    from gpufleet.lifecycle import pools

    pools.use(_store(), name)
    out.print(f"Default pool: {name}")


@pool_app.command("list")
def pool_list(
    name: Annotated[str | None, typer.Argument(help="One pool [default: every pool].")] = None,
    as_json: Json = False,
) -> None:
    """Each pool's nodes: GPU type, devices, free, memory, fabric, network and health (a node
    that left a Ray cluster shows as lost; simulated devices are marked)."""
    from gpufleet.lifecycle import pools

    store = _store()
    default = pools.default_name(store)
    rows_by_pool: list[tuple[str, str, str, list[dict[str, Any]] | str]] = []
    chosen = [None, *pools.all_pools(store)] if name is None else \
        [None if name == pools.LOCAL else pools.get(store, name)]
    for p in chosen:
        pname = p.name if p else pools.LOCAL
        kind = p.kind if p else "local"
        where = (p.address or "simulated") if p else "this host"
        try:
            nodes = pools.backend_for(p).discover()
        except GpufleetError as exc:
            rows_by_pool.append((pname, kind, where, str(exc)))
            continue
        rows_by_pool.append((pname, kind, where, pools.node_rows(nodes, *pools.held_on(
            store, p.name if p else None))))
    if as_json:
        _print_json([{"pool": n, "kind": k, "where": w, "default": n == default,
                      **({"error": r} if isinstance(r, str) else {"nodes": r})}
                     for n, k, w, r in rows_by_pool])
        return
    for pname, kind, where, rows in rows_by_pool:
        mark = " (default)" if pname == default else ""
        t = Table(title=f"Pool {pname}{mark}: {kind}, {where}", title_justify="left")
        if isinstance(rows, str):
            t.add_column("PROBLEM")
            t.add_row(rows)
            out.print(t)
            continue
        if len(rows) > LIST_NODES_UP_TO:
            rows = pools.grouped(rows)
        for col in ("NODE", "ADDRESS", "GPU", "DEVICES", "FREE", "MEMORY", "FABRIC", "NETWORK",
                    "HEALTH", "HELD BY"):
            t.add_column(col, justify="right" if col in ("DEVICES", "FREE", "MEMORY") else "left")
        for r in rows:
            t.add_row(r["node"], r["address"], r["gpu"] + (" (simulated)" if r["simulated"] else ""),
                      str(r["count"]), str(r["free"]),
                      f"{r['memory_gb']:g} GB" if r["memory_gb"] else "-", r["fabric"],
                      r["network"], r["health"], ", ".join(r["held_by"]) or "-")
        if any(r["simulated"] for r in rows):
            t.caption = "simulated: declared for tests and planning; runs as CPU workers, never billed"
        out.print(t)


# -- jobs ----------------------------------------------------------------------------------------
@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def run(
    ctx: typer.Context,
    script: Annotated[str | None, typer.Argument(help="Training script; its arguments go after --.")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-c", help="Existing cluster.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Make a cluster of this GPU type.")] = None,
    count: Annotated[int | None, typer.Option("--count", help="GPUs for the new cluster.")] = None,
    network: Annotated[str | None, typer.Option("--network", help="Fabric for the new cluster.")] = None,
    disk: Annotated[str | None, typer.Option("--disk", help="Scratch for the new cluster.")] = None,
    price_book: Annotated[str | None, typer.Option("--price-book", help="Bill under this book.")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", help="Nodes for the new cluster.")] = None,
    pool: Annotated[str | None, typer.Option(
        "--pool", help="Pool for the new cluster [default: the default pool].")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Job name.")] = None,
    file: Annotated[Path | None, typer.Option("-f", "--file", help="Job YAML.")] = None,
    workers_per_node: Annotated[int | None, typer.Option(
        "--workers-per-node", help="Processes per node [default: one per device].")] = None,
    strategy: Annotated[str | None, typer.Option(
        "--strategy", help="ddp, fsdp, zero1, zero2, zero3, tp or pp [default: ddp].")] = None,
    dp: Annotated[int | None, typer.Option("--dp", help="Data-parallel degree of the mesh.")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="Tensor-parallel degree.")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Pipeline stages.")] = None,
    pp_schedule: Annotated[str | None, typer.Option(
        "--pp-schedule", help="gpipe or 1f1b [default: 1f1b].")] = None,
    microbatches: Annotated[int | None, typer.Option(
        "--microbatches", help="Pipeline microbatches per step [default: --pp].")] = None,
    precision: Annotated[str | None, typer.Option(
        "--precision", help="fp32, bf16-mixed or fp16-mixed [default: fp32].")] = None,
    framework: Annotated[str | None, typer.Option(
        "--framework", help="torchrun, accelerate, deepspeed, ray or horovod [default: torchrun].")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print each node's command, env and generated configs; start nothing.")] = False,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE for workers.")] = None,
    max_restarts: Annotated[int | None, typer.Option(
        "--max-restarts", help="Restarts of the worker group on failure, from the last "
        "checkpoint [default: 0].")] = None,
    hang_timeout: Annotated[str | None, typer.Option(
        "--hang-timeout", help="No rank reporting for this long is a hang, handled as a "
        "failure [default: 5m].")] = None,
    checkpoint_to: Annotated[str | None, typer.Option(
        "--checkpoint-to", help="Durable folder or fsspec URL checkpoints are copied to.")] = None,
    workers: Annotated[str | None, typer.Option(
        "--workers", help="Elastic worker range MIN:MAX, resized on utilization.")] = None,
    scale_up_util: Annotated[float | None, typer.Option(
        "--scale-up-util", help="Grow at or above this mean utilization [default: 0.9].")] = None,
    scale_down_util: Annotated[float | None, typer.Option(
        "--scale-down-util", help="Shrink at or below this [default: 0.5].")] = None,
    cooldown: Annotated[str | None, typer.Option(
        "--cooldown", help="Wait after a start or resize before the next [default: 60s].")] = None,
    resume: Annotated[str | None, typer.Option(
        "--resume", help="Start an ended job again from its last checkpoint.")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep a new cluster after the job.")] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return at once.")] = False,
    cpu_slots: CpuSlots = None,
    yes: Yes = False,
) -> None:
    """Run a torchrun-style script on a cluster (existing, or new from --gpu/--count)."""
    if resume is not None:
        named = [opt for opt, v in (("SCRIPT", script), ("-f", file), ("--cluster", cluster),
                                    ("--gpu", gpu), ("--count", count), ("--name", name))
                 if v is not None]
        if named or ctx.args:
            raise SpecError([("resume", f"--resume continues a job as it was defined; drop "
                              f"{', '.join(named) or 'the script arguments'}")])
        _resume_job(resume, detach, yes, cpu_slots)
        return
    data: dict[str, Any] = load_yaml(file) if file else {}
    if script is not None:
        data["script"] = script
    if ctx.args:
        data["args"] = list(ctx.args)
    env_pairs = dict(data.get("env") or {})
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError([("env", f"'{item}' is not KEY=VALUE")])
        env_pairs[key] = value
    flags = {"name": name, "workers_per_node": workers_per_node, "strategy": strategy,
             "dp": dp, "tp": tp, "pp": pp, "pp_schedule": pp_schedule, "microbatches": microbatches,
             "precision": precision, "framework": framework, "max_restarts": max_restarts,
             "env": env_pairs or None, "keep": keep or None, "hang_timeout": hang_timeout,
             "checkpoint_to": checkpoint_to, "workers": workers, "scale_up_util": scale_up_util,
             "scale_down_util": scale_down_util, "cooldown": cooldown}
    data.update({k: v for k, v in flags.items() if v is not None})
    inline = {"gpu": gpu, "count": count, "network": network, "disk": disk,
              "price_book": price_book, "nodes": nodes, "pool": pool}
    if any(v is not None for v in inline.values()):
        if cluster:
            raise SpecError([("cluster", "give either --cluster NAME or --gpu/--count for a new "
                              "cluster, not both")])
        given = data.get("cluster")
        base: dict[str, Any] = given if isinstance(given, dict) else {}
        data["cluster"] = {**base, **{k: v for k, v in inline.items() if v is not None}}
    elif cluster:
        data["cluster"] = cluster
    if "script" not in data:
        raise SpecError([("script", "give a script to run, e.g. gpufleet run examples/gpt.py "
                          "--gpu cpu --count 2")])
    data.setdefault("workdir", str(Path.cwd()))
    if data.get("cluster") is None:
        raise SpecError([("cluster", "give --cluster NAME, or --gpu and --count for a new cluster")])
    if isinstance(data["cluster"], dict):
        data["cluster"] = _with_pool(_store(), data["cluster"])
    spec = JobSpec.parse(data)
    _run_job(spec, detach, yes, cpu_slots, dry_run)


def _preflight(spec: JobSpec, gpu: str, world: int, dry_run: bool = False) -> Layout:
    """Refuse a job whose layout, model, precision or framework cannot work, before anything
    starts or is reserved."""
    from gpufleet import preflight

    path = Path(spec.workdir or ".") / spec.script
    try:
        source: str | None = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        source = None  # not Python text we can read: the shape checks are skipped
    layout = preflight.check(spec, catalog.resolve_gpu(gpu), world, source)
    if not dry_run:
        module = preflight.FRAMEWORK_MODULES.get(spec.framework, ("",))[0]
        found = {module} if module and _importable(module) else set()
        problem = preflight.missing_framework(spec.framework, found)
        if spec.framework == "horovod" and not problem and not shutil.which("horovodrun"):
            problem = "horovodrun is not on PATH; install horovod with its launcher"
        if problem:
            raise SpecError([("framework", problem)])
    return layout


def _importable(module: str) -> bool:
    """Whether the job's Python can import `module`, tried in a child process: importing Ray or
    Horovod here would be slow, and a broken install can fail in any way."""
    try:
        probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                               timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def _print_dry_run(spec: JobSpec, layout: Layout, placements: list[Placement], cluster: str,
                   fabric: str) -> None:
    """What `run` would start, node by node, without starting or reserving anything."""
    from gpufleet.launch import frameworks
    from gpufleet.launch.torchrun import JobContext
    from gpufleet.store import gpufleet_home

    assert spec.name is not None
    job_dir = gpufleet_home() / "jobs" / spec.name
    ctx = JobContext(job_name=spec.name, cluster_name=cluster, job_dir=job_dir,
                     report_addr="127.0.0.1:<report port>", fabric=fabric, python=sys.executable,
                     host_cpus=os.cpu_count() or 1)
    if len(placements) > 1:  # what each node's agent runs (rendezvous on the head)
        head = placements[0].address
        commands = [(p.node_id, frameworks.build(spec, layout, p, ctx, rdzv=frameworks.Rendezvous(
            len(placements), i, f"{head}:<port>", spec.name, p.address)))
            for i, p in enumerate(placements)]
    else:
        commands = [(p.node_id, frameworks.build(spec, layout, p, ctx)) for p in placements]
    out.print(f"# dry run: job {spec.name}, {spec.framework}, {layout.describe}", markup=False,
              highlight=False, emoji=False)
    out.print(frameworks.describe(commands, job_dir), markup=False, highlight=False, soft_wrap=True,
              emoji=False)


def _run_job(spec: JobSpec, detach: bool, yes: bool, cpu_slots: int | None,
             dry_run: bool = False) -> None:
    from gpufleet.lifecycle import jobs

    store = _store()
    spec = spec.model_copy(update={"name": jobs.job_name_for(spec)})  # fixed once, used twice
    assert spec.name is not None
    made_here = isinstance(spec.cluster, ClusterSpec)
    if isinstance(spec.cluster, ClusterSpec):
        cspec = spec.cluster
        if cspec.name is None:
            cspec = cspec.model_copy(update={"name": clusters.new_name("run")})
        jobs.check_name_free(store, spec.name)
        jobs.check_workers(spec, cspec.per_node, cspec.name or "")
        layout = _preflight(spec, cspec.gpu, _first_world(spec, cspec.count, cspec.name or "",
                                                          cspec.node_count), dry_run)
        _check_pool_job(spec, cspec.backend, cspec.nodes or 1)
        if dry_run:
            from gpufleet.lifecycle import pools

            prow = pools.resolve(store, cspec.pool, cspec.backend)
            nodes = pools.backend_for(prow, cpu_slots).discover()
            alloc = clusters.check(store, cspec, nodes, prow.name if prow else None)
            _print_dry_run(spec, layout, list(alloc.placements), cspec.name or "",
                           clusters.network_of(cspec, alloc, nodes))
            return
        cluster = _launch(store, cspec, yes, cpu_slots, for_job=spec.name)
        try:
            _check_pool_job(spec, cluster.backend, cluster.nodes)
            jobs.check_workers(spec, cluster.count // cluster.nodes, cluster.name)
        except GpufleetError:
            clusters.stop(store, cluster.name, reason="job refused", cluster_id=cluster.id)
            raise
    else:
        assert spec.cluster is not None
        cluster = clusters.get(store, spec.cluster)
        if cluster.status not in clusters.ACTIVE:
            raise ConflictError(f"cluster: '{cluster.name}' is {cluster.status}; launch a new one")
        jobs.check_workers(spec, cluster.count // cluster.nodes, cluster.name)
        _check_pool_job(spec, cluster.backend, cluster.nodes)
        jobs.check_name_free(store, spec.name)
        jobs.check_cluster_free(store, cluster)
        layout = _preflight(spec, cluster.gpu, _first_world(spec, cluster.count, cluster.name,
                                                           cluster.nodes), dry_run)
        if dry_run:
            _print_dry_run(spec, layout, clusters.placements(store, cluster), cluster.name,
                           cluster.network)
            return
    world = _first_world(spec, cluster.count, cluster.name, cluster.nodes)
    try:
        job = jobs.create(store, spec, cluster, world)
    except GpufleetError:
        if made_here:
            clusters.stop(store, cluster.name, reason="job could not be created",
                          cluster_id=cluster.id)
        raise
    _supervise(store, job, cluster, detach, cpu_slots)


def _check_pool_job(spec: JobSpec, backend: str, nodes: int) -> None:
    """What a job on a pool other than this host cannot do, refused before anything starts."""
    from gpufleet.launch.frameworks import MULTI_NODE_FRAMEWORKS

    if backend == "sim":
        raise SpecError([("cluster", "a simulated pool only plans and reserves; run jobs on the "
                          "local pool or a Ray pool (--pool local, or gpufleet pool up --local)")])
    if backend == "ray" or nodes > 1:
        if spec.framework not in MULTI_NODE_FRAMEWORKS:
            raise SpecError([("framework", f"'{spec.framework}' runs on this host's pool only; "
                              f"on a Ray pool allowed: {', '.join(MULTI_NODE_FRAMEWORKS)}")])
        if spec.worker_range is not None:
            raise SpecError([("workers", "elastic resizing runs on the local pool only; on a "
                              "Ray pool, --max-restarts replaces a lost node instead")])


def _first_world(spec: JobSpec, devices: int, cluster: str, nodes: int = 1) -> int:
    """Workers the job starts with: one per device (or --workers-per-node), or for an elastic
    job the largest size in its range that the cluster's devices allow."""
    from gpufleet.supervise.supervisor import elastic_plan

    if spec.worker_range is None:
        return spec.workers_per_node * nodes if spec.workers_per_node else devices
    policy, allowed, first = elastic_plan(spec, devices)
    assert policy is not None
    if not allowed:
        raise SpecError([("workers", f"no size in {spec.workers} suits the job: a size must "
                          f"divide {policy.max_workers} (the global batch is fixed at the "
                          "largest size) and fit its layout")])
    if first > devices:
        raise SpecError([("workers", f"{spec.workers} needs at least {allowed[0]} device(s); "
                          f"cluster {cluster} has {devices} (use --count {allowed[0]} or more)")])
    return first


def _resume_job(name: str, detach: bool, yes: bool, cpu_slots: int | None) -> None:
    """`run --resume JOB`: the same job record, on its cluster (made again if it was made for
    the job), from the newest checkpoint in its folder."""
    from gpufleet.lifecycle import jobs
    from gpufleet.store import Cluster as ClusterRow

    store = _store()
    job = jobs.get(store, name)
    if job.status in jobs.ACTIVE:
        raise ConflictError(f"resume: job '{name}' is {job.status}; stop it first "
                            f"(gpufleet stop {name}) or follow it (gpufleet logs {name} -f)")
    if job.status == "succeeded":
        raise ConflictError(f"resume: job '{name}' already succeeded; nothing to resume")
    spec = jobs.spec_of(job)
    with store.read() as s:
        old = s.get(ClusterRow, job.cluster_id)
    assert old is not None
    if old.status in clusters.ACTIVE:
        cluster = old
    elif old.for_job == job.name:
        cspec = ClusterSpec.model_validate_json(old.spec_json).model_copy(update={"name": old.name})
        cluster = _launch(store, cspec, yes, cpu_slots, for_job=job.name)
    else:
        cluster = clusters.get(store, old.name)
        if cluster.status not in clusters.ACTIVE:
            raise ConflictError(f"cluster: job '{name}' ran on cluster '{old.name}', which is "
                                f"stopped; launch one with that name (gpufleet launch --name "
                                f"{old.name} ...) and resume again")
    try:
        jobs.check_cluster_free(store, cluster)
        world = _first_world(spec, cluster.count, cluster.name, cluster.nodes)
        _preflight(spec, cluster.gpu, world)
        job = jobs.reopen(store, job, cluster, world,
                          "resumed by gpufleet run --resume, from its newest checkpoint")
    except GpufleetError:
        if cluster.for_job == job.name and cluster.id != old.id:
            clusters.stop(store, cluster.name, reason="job could not resume", cluster_id=cluster.id)
        raise
    _supervise(store, job, cluster, detach, cpu_slots)


def _supervise(store: Store, job: Job, cluster: Cluster, detach: bool,
               cpu_slots: int | None = None) -> None:
    """Hand the job to its supervisor: a detached process, or this one with a live view."""
    from gpufleet.lifecycle import jobs

    if detach:
        jobs.set_supervisor(store, job.id, _start_detached(job, cpu_slots))
        out.print(f"Job [bold]{job.name}[/] started on {cluster.name} in the background.\n"
                  f"  follow:  gpufleet logs {job.name} -f\n  status:  gpufleet status {job.name}"
                  f"\n  stop:    gpufleet stop {job.name}")
        return
    jobs.set_supervisor(store, job.id, os.getpid())  # this process supervises it
    final, interrupted = _foreground(store, job, cluster, cpu_slots)
    if final.status == "succeeded":
        raise typer.Exit(0)
    raise typer.Exit(130 if interrupted else 1)  # 130: what a shell reports after Ctrl-C


def _start_detached(job: Job, cpu_slots: int | None = None) -> int:
    """Start the job's own supervisor process; its pid. It sees the pool as this command did
    (`--cpu-slots`), for an elastic job growing its cluster."""
    env = dict(os.environ)
    if cpu_slots is not None:
        env["GPUFLEET_CPU_SLOTS"] = str(cpu_slots)
    with open(Path(job.job_dir) / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.supervise.supervisor", job.name], env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    return proc.pid


def _foreground(store: Store, job: Job, cluster: Cluster,
                cpu_slots: int | None = None) -> tuple[Job, bool]:
    """Supervise the job in this process with a live view; (final job, ended by Ctrl-C)."""
    from gpufleet import ui
    from gpufleet.supervise.supervisor import Supervisor

    tty = out.is_terminal
    last_line = [0.0]

    def on_line(rank: int | None, text: str) -> None:
        # rank 0 and the agent speak for the job; every rank's lines are in `gpufleet logs`
        if rank in (0, None):
            label = "agent" if rank is None else f"rank{rank}"
            out.print(f"[{label}] {text}", markup=False, highlight=False, soft_wrap=True,
                      emoji=False)

    if tty:  # a live panel under the scrolling log lines
        with Live(console=out, refresh_per_second=4, transient=True) as live:
            sup = Supervisor(store, job, cluster, _cluster_backend(store, cluster, cpu_slots),
                             on_tick=lambda v: live.update(ui.job_panel(v)), on_line=on_line)
            final = sup.run()
    else:  # logs and a progress line every 10 s
        def on_tick(v: Any) -> None:
            if v.step is not None and time.time() - last_line[0] >= 10:
                last_line[0] = time.time()
                out.print(ui.progress_line(v), markup=False, highlight=False)

        sup = Supervisor(store, job, cluster, _cluster_backend(store, cluster, cpu_slots),
                         on_tick=on_tick, on_line=on_line)
        final = sup.run()
    try:
        out.print(ui.summary_table(sup.view()))
        out.print(f"Logs: gpufleet logs {final.name}   (per rank: {final.job_dir}/logs)")
    except BrokenPipeError:  # `gpufleet run ... | head`: the job's outcome still sets the exit code
        _silence_stdout()
    return final, sup.interrupted


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="Job name.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until it ends.")] = False,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank's log.")] = None,
) -> None:
    """A job's output, every rank's lines prefixed by their rank, or one rank with --rank."""
    from gpufleet.lifecycle import jobs

    store = _store()
    j = jobs.get(store, job)
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
            return
        if jobs.refresh(store, job).status not in jobs.ACTIVE:
            if path.exists() and path.stat().st_size > pos:
                continue
            return
        time.sleep(0.5)


@app.command()
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
    from gpufleet import ui
    from gpufleet.lifecycle import jobs
    from gpufleet.web import data

    store = _store()
    detail = data.job_detail(store, job, time.time())
    if as_json:
        _print_json(detail)
        return
    follow = (watch or (out.is_terminal and not once)) and detail["status"] in jobs.ACTIVE
    if follow:
        try:
            with Live(ui.status_view(detail), console=out, refresh_per_second=2) as live:
                while detail["status"] in jobs.ACTIVE:
                    time.sleep(0.5)
                    detail = data.job_detail(store, job, time.time())
                    live.update(ui.status_view(detail))
        except KeyboardInterrupt:  # leaving the view does not stop the job
            return
    else:
        out.print(ui.status_view(detail))


@app.command()
def dashboard(
    name: Annotated[str | None, typer.Argument(
        help="A cluster or job to open the page on [default: the newest job].")] = None,
    port: Annotated[int, typer.Option("--port", "-p", help="Port to serve on (0: any free).",
                                      min=0, max=65535)] = 8470,
    host: Annotated[str, typer.Option(
        "--host", help="Address to bind. Anything but loopback requires the token printed "
        "at start (kept in $GPUFLEET_HOME/dashboard-token).")] = "127.0.0.1",
) -> None:
    """Serve the live dashboard: every cluster and job, charts, cost, ETA, diagnosis; a JSON
    API under /api and Prometheus metrics at /metrics."""
    import socket

    import uvicorn

    from gpufleet.store import gpufleet_home
    from gpufleet.web import auth
    from gpufleet.web.app import create_app

    store = _store()
    if name is not None:
        _check_focus(store, name)
    token = None if auth.is_loopback(host) else auth.token(gpufleet_home())
    try:  # bind first, so a busy port is one clear line, not a server traceback
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, UnicodeError) as exc:
        raise SpecError([("port" if "in use" in str(exc) else "host",
                          f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}"
                          + ("; pick another with --port, or --port 0 for any free one"
                             if "in use" in str(exc) else ""))]) from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/"
    err.print(f"gpufleet dashboard on {url}" + (f"?token={token}" if token else "")
              + "   (Ctrl-C to stop)", highlight=False, soft_wrap=True)
    if token:
        err.print(f"API and /metrics need 'Authorization: Bearer {token}'", highlight=False,
                  soft_wrap=True)
    config = uvicorn.Config(create_app(store, token=token, focus=name, bound=host),
                            log_level="warning",
                            access_log=False)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass


def _check_focus(store: Store, name: str) -> None:
    with store.read() as s:
        found = s.scalar(select(Job.id).where(Job.name == name)) or \
            s.scalar(select(Cluster.id).where(Cluster.name == name))
    if found is None:
        raise NotFoundError(f"name: no cluster or job called '{name}' (see gpufleet list --all)")


@app.command()
def doctor(
    cluster: Annotated[str | None, typer.Option(
        "--cluster", "-c", help="Check this cluster's devices and environment.")] = None,
    as_json: Json = False,
) -> None:
    """Check this machine for training: devices, driver/CUDA/torch/NCCL versions, BF16,
    topology, NCCL settings, /dev/shm, open files, disk, and a real all-reduce."""
    from gpufleet.doctor.command import doctor as run_doctor

    raise typer.Exit(run_doctor(cluster, as_json, out))


bench_app = typer.Typer(
    help="Measure a cluster (collective bandwidth, a script's scaling) and save a calibration "
    "file for `plan --calibration`.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("allreduce")
def bench_allreduce(
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Cluster to measure (idle).")],
    sizes: Annotated[str | None, typer.Option(
        "--sizes", help="Bytes: 1K,1M,64M or MIN:MAX in steps of 4 [default: 1K:64M on CPU, "
        "1K:1G on GPUs].")] = None,
    iters: Annotated[int, typer.Option("--iters", help="Timed calls per size.", min=1, max=10000)] = 20,
    out_file: Annotated[Path | None, typer.Option(
        "--out", help="Calibration file [default: calibration-CLUSTER.json].")] = None,
    as_json: Json = False,
) -> None:
    """All-reduce, all-gather, reduce-scatter and broadcast over a size sweep, nccl-tests style
    (time, algbw, busbw) against the interconnect's catalog peak."""
    from gpufleet.measure import collectives, command

    try:
        parsed = collectives.parse_sizes(sizes) if sizes else None
    except ValueError as exc:
        raise SpecError([("sizes", f"{exc}; use e.g. 1K,1M,64M or 1K:64M")]) from None
    command.allreduce(cluster, parsed, iters, out_file, as_json, out)


@bench_app.command("scaling", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def bench_scaling(
    ctx: typer.Context,
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Cluster to run on (idle).")],
    script: Annotated[str, typer.Option("--script", help="Training script; its arguments after --.")],
    workers: Annotated[str, typer.Option("--workers", help="World sizes, e.g. 1,2,4.")] = "1,2",
    model: Annotated[str | None, typer.Option(
        "--model", help="Catalog model the script trains, to turn samples/s into FLOP/s.")] = None,
    params: Annotated[float | None, typer.Option("--params", help="Or its parameter count.")] = None,
    config: Annotated[str | None, typer.Option("--config", help="Or its config.json.")] = None,
    seq: Annotated[int | None, typer.Option(
        "--seq", help="Tokens per sample [default: the model's].")] = None,
    strategy: Annotated[str, typer.Option("--strategy", help="Passed to `gpufleet run`.")] = "ddp",
    precision: Annotated[str, typer.Option("--precision", help="Passed to `gpufleet run`.")] = "fp32",
    out_file: Annotated[Path | None, typer.Option(
        "--out", help="Calibration file [default: calibration-CLUSTER.json].")] = None,
    cpu_slots: CpuSlots = None,
    as_json: Json = False,
) -> None:
    """Run a script at each world size through `gpufleet run`; print samples/s, scaling
    efficiency and cost per 1,000 samples, like the seed's benchmark tables."""
    from gpufleet.measure import command
    from gpufleet.plan.command import load_model
    from gpufleet.spec import PlanSpec

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


def _stop_job(store: Store, j: Job, timeout_s: float = 30.0) -> None:
    from gpufleet.lifecycle import jobs

    j = jobs.refresh(store, j.name)  # as it is now, not as `stop` first read it
    if j.status not in jobs.ACTIVE:
        return
    if j.supervisor_pid is None:  # created a moment ago: its supervisor sees this and backs off
        jobs.transition(store, j.id, "stopped", f"{jobs.STOP_REQUESTED} before it started",
                        expect=("starting",))
        return
    jobs.mark_stop_requested(store, j.id)
    try:
        os.kill(j.supervisor_pid, signal.SIGTERM)
    except ProcessLookupError:  # it ended between our look and the signal
        jobs.reconcile(store)
        return
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if jobs.refresh(store, j.name).status not in jobs.ACTIVE:
            return
        time.sleep(0.2)
    raise ConflictError(f"job {j.name}: the supervisor (pid {j.supervisor_pid}) did not stop "
                        f"within {timeout_s:.0f}s; it may still be ending its workers")


@app.command()
def stop(
    name: Annotated[str | None, typer.Argument(help="Cluster or job name.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every running cluster.")] = False,
) -> None:
    """Stop a job (its workers end) or a cluster (its job ends, its devices are freed)."""
    from gpufleet.lifecycle import jobs

    if not name and not all_:
        raise SpecError([("name", "give a cluster or job name, or --all")])
    store = _store()
    with store.session() as s:
        if all_:
            targets = list(s.scalars(select(Cluster).where(Cluster.status.in_(clusters.ACTIVE))))
            job_row = None
        else:
            named = list(s.scalars(select(Cluster).where(Cluster.name == name)))
            targets = [c for c in named if c.status in clusters.ACTIVE]
            job_row = s.scalar(select(Job).where(Job.name == name)) if not named else None
    if not all_ and named and not targets:
        out.print(f"Cluster {name} is already stopped.")
        return
    if job_row is not None:
        _stop_job(store, job_row)
        out.print(f"Job {job_row.name}: {jobs.get(store, job_row.name).status}")
        return
    if not targets and not all_:
        raise NotFoundError(f"name: no cluster or job named '{name}'")
    for c in targets:
        running = clusters.running_job(store, c.id)
        if running is not None:
            _stop_job(store, running)
        c = clusters.stop(store, c.name, cluster_id=c.id)
        spent = cost.accrued_usd(c.usd_per_hour, c.started_at, c.stopped_at, time.time(),
                                 c.banked_usd or 0.0, c.rate_since)
        out.print(f"Cluster {c.name}: {c.status}, devices freed, cost ${spent:.4f}")
    if all_ and not targets:
        out.print("No running clusters.")


def _silence_stdout() -> None:
    """Point stdout at /dev/null after its reader went away, so exiting does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # `gpufleet list | head -1`: the reader has all it wanted
        _silence_stdout()
        sys.exit(1)
    except GpufleetError as e:
        err.print(Text.assemble(("error: ", "bold red"), str(e)), highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
