"""`pool ...`: the pools clusters are carved from (this host, Ray clusters, Slurm partitions,
synthetic pools)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.app import COMMAND, app, err, group, out, print_json, store
from gpufleet.cli.connect import client
from gpufleet.cli.options import Image, Json, NoDefault, default

pool_app = group("Pools of nodes: this host, Ray clusters, Slurm partitions, your own machines "
                 "over ssh, synthetic pools.")
app.add_typer(pool_app, name="pool")
LIST_NODES_UP_TO = 64  # larger pools are listed as groups of alike nodes


@pool_app.command("add", cls=COMMAND)
def pool_add(
    kind: Annotated[str, typer.Argument(
        help="ray (an existing Ray cluster), slurm (a Slurm partition), ssh (your own "
        "machines over ssh) or sim (synthetic).")],
    address: Annotated[str | None, typer.Option(
        "--address", help="ray: the head's HOST:PORT (as for `ray start --address`).")] = None,
    shape: Annotated[list[str] | None, typer.Option(
        "--shape", help="sim: NODESxGPU:PER_NODE[:NETWORK], repeatable, e.g. 1000xH100:8")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Pool name." + default("the kind"))] = None,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="ray: the cluster's auth token (`ray get-auth-token` on the head) "
        "(else $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); a copy is "
        "kept with the pool.")] = None,
    partition: Annotated[str | None, typer.Option(
        "--partition", help="slurm: the partition to allocate from." + default(
            "the cluster's default partition"))] = None,
    account: Annotated[str | None, typer.Option(
        "--account", help="slurm: the account jobs are charged to (sbatch --account).")] = None,
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="ssh: a machine's address or name, repeatable.")] = None,
    hostfile: Annotated[Path | None, typer.Option(
        "--hostfile", help="ssh: one machine a line, `HOST slots=N [gpu=TYPE] [user=U] "
        "[port=P] [identity=PATH] [python=PATH]` (# comments).")] = None,
    user: Annotated[str | None, typer.Option(
        "--user", help="ssh: the login on every host." + default("ssh's own"))] = None,
    identity: Annotated[Path | None, typer.Option(
        "--identity", help="ssh: the private key's path (kept as a path; the key is never "
        "copied)." + default("ssh's own keys"))] = None,
    port: Annotated[int | None, typer.Option("--port", help="ssh: sshd's port.")] = None,
    python: Annotated[str | None, typer.Option(
        "--python", help="ssh, slurm: the nodes' Python with torch and gpufleet (a path on the "
        "nodes or a command on their PATH)." + default("ssh: python3 on the node's PATH; "
        "slurm: this machine's interpreter path, for nodes that share its files"))] = None,
    image: Image = None,
    no_default: NoDefault = False,
) -> None:
    """Register a pool; it becomes the default for launch and run unless --no-default.

    slurm: a Slurm cluster reached with this machine's client commands (sinfo, scontrol,
    sbatch, srun, scancel, squeue) and $SLURM_CONF; each gpufleet cluster is one allocation.

    ssh: machines that answer ssh with a key (no password prompts); their host keys are pinned
    now and shown, and a machine whose key later changes is refused."""
    from rich.markup import escape

    from gpufleet.backends.adders import HostsAsk
    from gpufleet.lifecycle import pool_setup

    pool_setup.check_kind(kind)  # before the store is opened
    ssh = HostsAsk(host or [], hostfile, user, identity, port, python)
    added = pool_setup.add(store(), kind, name, address, shape or [], token_file, not no_default,
                           partition, account, ssh, image)
    out.print(f"Pool [bold]{added.name}[/]: {escape(added.summary)}.")
    if not no_default:
        out.print("It is now the default pool (back to this host: gpufleet pool use local).")


@pool_app.command("up", cls=COMMAND)
def pool_up(
    local: Annotated[bool, typer.Option("--local", help="Start a Ray cluster on this machine.")] = False,
    nodes: Annotated[int, typer.Option("--nodes", help="Raylets: a head and workers.")] = 3,
    gpu: Annotated[str, typer.Option(
        "--gpu", help="Simulated GPU type each node declares (cpu: plain CPU slots).")] = "H100",
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="Devices per node.")] = 2,
    fabric: Annotated[str | None, typer.Option(
        "--fabric", help="pcie, nvlink or nvswitch inside a node." + default("the type's own"))] = None,
    network: Annotated[str, typer.Option(
        "--network", help="infiniband or ethernet between nodes.")] = "infiniband",
    name: Annotated[str, typer.Option("--name", help="Pool name.")] = "local-ray",
    no_default: NoDefault = False,
) -> None:
    """Start a real multi-node Ray cluster here (one raylet per node on its own 127.x address)
    whose nodes declare simulated GPUs that run as CPU workers with gloo, and add it as a pool."""
    from gpufleet.lifecycle import pool_setup

    gtype = pool_setup.check_local_ray(local, nodes, gpu, gpus_per_node, fabric, network)
    started = time.monotonic()
    cfg = pool_setup.start_local_ray(
        store(), name, nodes, gtype, gpus_per_node, fabric, network, not no_default,
        on_node=lambda node, ip: err.print(
            f"  started {node} at {ip} ({time.monotonic() - started:.1f} s)"))
    sim = "" if gtype.is_cpu else " simulated"
    out.print(f"Pool [bold]{name}[/]: Ray cluster at {cfg.address}, {nodes} node(s) x "
              f"{gpus_per_node}{sim} {gtype.name} over {cfg.fabric}, {network} between nodes "
              f"({time.monotonic() - started:.1f} s){'' if no_default else ', now the default pool'}."
              f" Stop it: gpufleet pool down {name}")


@pool_app.command("down", cls=COMMAND)
def pool_down(name: Annotated[str, typer.Argument(help="A pool started by pool up --local.")]) -> None:
    """Stop a local Ray cluster started by `pool up --local` and forget the pool."""
    from gpufleet.lifecycle import pool_setup

    ended = pool_setup.stop_local_ray(store(), name)
    out.print(f"Pool {name} stopped ({ended} Ray process(es) ended).")


@pool_app.command("remove", cls=COMMAND)
def pool_remove(name: Annotated[str, typer.Argument(help="Pool name.")]) -> None:
    """Forget a pool. A Ray cluster it points to keeps running, unless `pool up --local`
    started it: that one is stopped too."""
    from gpufleet.lifecycle import pool_setup

    pool_setup.remove(store(), name)
    out.print(f"Pool {name} removed.")


@pool_app.command("use", cls=COMMAND)
def pool_use(name: Annotated[str, typer.Argument(help="Pool name, or local for this host.")]) -> None:
    """Make a pool the default for launch and run."""
    from gpufleet.lifecycle import pools

    pools.use(store(), name)
    out.print(f"Default pool: {name}")


@pool_app.command("list", cls=COMMAND)
def pool_list(
    name: Annotated[str | None, typer.Argument(help="One pool." + default("every pool"))] = None,
    as_json: Json = False,
) -> None:
    """Each pool's nodes: GPU type, devices, free, memory, fabric, network and health (a node
    that left a Ray cluster, or that Slurm marks down or drained, shows as lost; a Slurm node
    shows Slurm's state, and its GPUs other Slurm jobs hold are not free; simulated devices
    are marked)."""
    from rich.table import Table

    from gpufleet.lifecycle import pools

    listed = client().pools(name)
    if as_json:
        print_json(listed)
        return
    for p in listed:
        mark = " (default)" if p["default"] else ""
        image = f", image {p['image']}" if p.get("image") else ""
        t = Table(title=f"Pool {p['pool']}{mark}: {p['kind']}, {p['where']}{image}",
                  title_justify="left")
        if "error" in p:
            t.add_column("PROBLEM")
            t.add_row(p["error"])
            out.print(t)
            continue
        rows = p["nodes"]
        if len(rows) > LIST_NODES_UP_TO:
            rows = pools.grouped(rows)
        states = any(r.get("state") for r in rows)  # an engine that has its own word (Slurm)
        for col in ("NODE", "ADDRESS", "GPU", "DEVICES", "FREE", "MEMORY", "FABRIC", "NETWORK",
                    *(["STATE"] if states else []), "HEALTH", "HELD BY"):
            t.add_column(col, justify="right" if col in ("DEVICES", "FREE", "MEMORY") else "left")
        for r in rows:
            t.add_row(r["node"], r["address"], r["gpu"] + (" (simulated)" if r["simulated"] else ""),
                      str(r["count"]), str(r["free"]),
                      f"{r['memory_gb']:g} GB" if r["memory_gb"] else "-", r["fabric"],
                      r["network"], *([r.get("state") or "-"] if states else []), r["health"],
                      ", ".join(r["held_by"]) or "-")
        if any(r["simulated"] for r in rows):
            t.caption = "simulated: declared for tests and planning; runs as CPU workers, never billed"
        out.print(t)
