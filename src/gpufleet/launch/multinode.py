"""The plan a Ray driver runs: one torchrun per node of the cluster, with what each needs.

Pure: placements, the job and where it reports in; a JSON-able plan out (written to the job
folder as ray-plan.json, so a user can read exactly what ran where).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.launch import frameworks, travel
from gpufleet.launch.container import container_of
from gpufleet.launch.torchrun import JobContext
from gpufleet.parallelism import Layout
from gpufleet.pool.model import Node, Placement
from gpufleet.spec import JobSpec
from gpufleet.telemetry.wire import NODE_ENV

PYTHON = "{python}"  # the node's own interpreter, filled in by its agent


def node_names(count: int) -> list[str]:
    """What the cluster calls its nodes: the head, then worker1, worker2... (`gpufleet ssh
    NAME-worker1`)."""
    return ["head"] + [f"worker{i}" for i in range(1, count)]


def plan(spec: JobSpec, layout: Layout, placements: list[Placement], nodes: dict[str, Node],
         ctx: JobContext, port: int, run_id: str, user_env: dict[str, str],
         ready_timeout_s: float, address: str, loopback: bool,
         memory_per_slot: int) -> dict[str, Any]:
    names = node_names(len(placements))
    head = placements[0].address
    # the job's image: each node's agent checks it there and starts its launcher inside
    # (backends/node_image.py); the agent itself stays on the node's host
    image = container_of(spec, ctx.job_name)
    entries = []
    node_ctx = JobContext(**{**ctx.__dict__, "python": PYTHON})
    for i, (p, name) in enumerate(zip(placements, names, strict=True)):
        rdzv = frameworks.Rendezvous(nnodes=len(placements), node_rank=i,
                                     endpoint=f"{head}:{port}", run_id=run_id, local_addr=p.address)
        cmd = frameworks.build(spec, layout, p, node_ctx, port=port, rdzv=rdzv)
        # GPUFLEET_NODE: the node's name in the cluster (ssh, log lines); GPUFLEET_NODE_ID: the
        # pool's node (`pool list`), which the ranks' reports and device samples are labelled with
        # GPUFLEET_RDZV_ENDPOINT: where the node's agent checks it reaches the head, and the
        # route it picks the workers' interface by (backends/node_net.py)
        env = {**cmd.env, "GPUFLEET_NODE": name, NODE_ENV: p.node_id,
               "GPUFLEET_RDZV_ENDPOINT": f"{head}:{port}", **user_env}
        if loopback:  # nodes on 127.x addresses of one machine: gloo's pairs stay on lo
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        on_cpu = env.get("GPUFLEET_DEVICE") == "cpu"
        simulated = any(d.simulated for d in nodes[p.node_id].devices)
        per = len(p.devices)
        resources = {"gpufleet_gpu": per} if (on_cpu or simulated) else {"GPU": per}
        entries.append({
            "name": name, "node_id": p.node_id, "ray_id": nodes[p.node_id].ref,
            "address": p.address, "argv": cmd.argv, "env": env, "files": cmd.files,
            "cwd": str(Path(spec.workdir or ".")), "resources": resources,
            "container": image.to_json() if image else None, "run": run_id,
            "sampling": {"devices": [d.id for d in p.devices],
                         "indices": [d.index for d in p.devices], "key_base": i * per,
                         "on_cpu": on_cpu, "threads": int(env.get("OMP_NUM_THREADS", "1")),
                         "memory_per_slot": memory_per_slot},
        })
    return {"address": address, "job": ctx.job_name, "report_addr": ctx.report_addr,
            "ready_timeout_s": ready_timeout_s, "nodes": entries,
            # what travels where nodes do not see it (launch/travel.py; the driver decides)
            "workdir": travel.section(spec.workdir, spec.script, spec.setup,
                                      spec.max_upload_bytes, spec.keep_workdir)}
