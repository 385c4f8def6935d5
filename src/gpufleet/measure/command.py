"""`gpufleet bench allreduce` and `gpufleet bench scaling`: run on a cluster's reserved devices,
print nccl-tests / seed-style tables, and write the calibration file `plan --calibration` reads.

The collective sweep starts torchrun directly on the cluster's devices (like `doctor`); the
scaling sweep runs the user's script through `gpufleet run` itself, once per worker count, so it
measures exactly what a job gets (supervision, telemetry and all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpufleet import catalog
from gpufleet.backends.kinds import capabilities
from gpufleet.errors import ConflictError, GpufleetError, NotFoundError, SpecError
from gpufleet.launch.env import device_env
from gpufleet.lifecycle import clusters
from gpufleet.measure.collectives import DEFAULT_SIZES_CPU, DEFAULT_SIZES_GPU, Row, parse_rows
from gpufleet.plan import calibration as calib
from gpufleet.plan import compute, cost
from gpufleet.plan.models import Model
from gpufleet.pool.model import Placement
from gpufleet.slot_words import network_shown
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Store, gpufleet_home

TIMEOUT_S = 600.0


def default_out(cluster: str) -> Path:
    """Where a bench writes without --out: under the state folder, not the current one (a
    checkout, a shared folder), which a bench must not leave files in. `plan --calibration`
    finds it there by its file name too (`plan.command.calibration_path`)."""
    folder = gpufleet_home() / calib.FOLDER
    folder.mkdir(mode=0o700, exist_ok=True)  # owner-only, as the state folder's own
    return folder / calib.file_name(cluster)


def _cluster(store: Store, name: str) -> tuple[Cluster, Placement]:
    """The cluster, idle and on one node: a benchmark beside a running job measures neither."""
    c = clusters.get(store, name)
    if c.status not in clusters.ACTIVE:
        raise ConflictError(f"cluster: '{name}' is {c.status}; launch it again to measure it")
    job = clusters.running_job(store, c.id)
    if job is not None:
        raise ConflictError(f"cluster: '{name}' is running job '{job.name}'; measure it when idle "
                            "(a benchmark beside a job measures neither)")
    if not capabilities(c.backend).this_host:
        raise GpufleetError(f"cluster: '{name}' is on pool {c.pool}; bench allreduce measures "
                            "this host's devices today (bench scaling runs through gpufleet run "
                            "and works on any pool)")
    places = clusters.placements(store, c)
    if len(places) != 1:
        raise GpufleetError(f"cluster: '{name}' spans {len(places)} nodes; bench measures one node today")
    return c, places[0]


def check_out(path: Path) -> None:
    """Refuse an output the run could not write, before the run: a folder, a missing or
    read-only folder, or a file that is not a calibration (it would be overwritten)."""
    if path.is_dir():
        raise SpecError([("out", f"{path} is a folder; give a file name, e.g. {path / 'calibration.json'}")])
    folder = path.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise SpecError([("out", f"{path}: the folder {folder} does not exist or is not writable")])
    if path.exists():
        try:
            kind = json.loads(path.read_text("utf-8")).get("kind")
        except (OSError, ValueError, AttributeError):
            kind = None
        if kind != calib.KIND:
            raise SpecError([("out", f"{path} exists and is not a gpufleet calibration file; "
                              "refusing to overwrite it")])


def save(path: Path, new: calib.Calibration) -> calib.Calibration:
    """Merge into an existing file of the same GPU type and network, else replace it."""
    old = None
    if path.exists():
        try:
            old = calib.from_dict(json.loads(path.read_text("utf-8")), str(path))
        except (SpecError, ValueError):
            old = None  # not ours or damaged: replaced whole
    merged = calib.merge(old, new)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(merged.to_dict(), indent=2) + "\n", "utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise GpufleetError(f"out: cannot write {path}: {exc}") from None
    return merged


# -- collectives --------------------------------------------------------------------------------
def allreduce(name: str, sizes: tuple[int, ...] | None, iters: int, out: Path | None,
              as_json: bool, console: Console) -> None:
    from gpufleet.backends.local import LocalBackend

    store = Store()
    c, placement = _cluster(store, name)
    path = out or default_out(c.name)
    check_out(path)
    workers = len(placement.devices)
    if workers < 2:
        raise SpecError([("cluster", f"'{name}' has 1 device; collectives need at least 2 "
                          "(launch one with --count 2 or more)")])
    on_cpu = c.gpu == "cpu"
    sizes = sizes or (DEFAULT_SIZES_CPU if on_cpu else DEFAULT_SIZES_GPU)
    host_cpus = os.cpu_count() or 1
    env = {**os.environ, **device_env(placement, c.network, host_cpus), "PYTHONUNBUFFERED": "1",
           "GPUFLEET_CLUSTER": c.name}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(workers), "--max-restarts", "0", "-m",
            "gpufleet.measure.collectives", "--sizes", ",".join(map(str, sizes)), "--iters", str(iters)]
    if not as_json:
        console.print(f"Measuring 4 collectives x {len(sizes)} sizes on {workers} x {c.gpu} "
                      f"({env['GPUFLEET_BACKEND']}) ...")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as cwd:
        text, code = LocalBackend(cpu_slots=1).run_to_end(argv, env, Path(cwd), TIMEOUT_S)
    if code is None:
        raise GpufleetError(f"bench: the collectives did not finish in {TIMEOUT_S:g} s; "
                            "try fewer --sizes or --iters")
    lines = text.splitlines()
    rows, failures = parse_rows(lines, workers)
    if code != 0 or failures or not rows:
        from gpufleet.doctor.checks import failure_lines

        why = "; ".join(failures) if failures else failure_lines(tuple(lines))
        raise GpufleetError(f"bench: the collectives failed (exit {code}): {why}")
    fabric = catalog.interconnects()[c.network]
    peak = fabric.bw_gbps_per_direction
    gpu = catalog.gpu_types().get(c.gpu)
    if gpu is not None and c.network in ("nvlink", "nvswitch") and gpu.nvlink_gbps > 0:
        peak = min(peak, gpu.nvlink_gbps)
    new = calib.Calibration(gpu=c.gpu, network=c.network, host_cpus=host_cpus,
                            collective_workers=workers, collectives=tuple(r.point() for r in rows),
                            notes=(f"bench allreduce on cluster {c.name}, "
                                   f"{time.strftime('%Y-%m-%d %H:%M')}",))
    save(path, new)
    if as_json:
        sys.stdout.write(json.dumps({"cluster": c.name, "workers": workers,
                                     "backend": env["GPUFLEET_BACKEND"],
                                     "peak_gbps": peak, "calibration": str(path),
                                     "rows": [{"op": r.op, "bytes": r.bytes, "time_us": r.seconds * 1e6,
                                               "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps}
                                              for r in rows]}, indent=2) + "\n")
        return
    render_collectives(rows, workers, network_shown(c.gpu, c.network), peak, on_cpu, console)
    console.print(f"Calibration saved to {path}; use it: gpufleet plan ... --calibration {path}")


def _size(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n}"


def render_collectives(rows: list[Row], workers: int, network: str, peak: float, on_cpu: bool,
                       console: Console) -> None:
    for op in dict.fromkeys(r.op for r in rows):
        t = Table(title=f"{op}: {workers} workers over {network}", title_justify="left")
        t.caption = ("CPU workers: gloo through host memory, no link peak applies" if on_cpu
                     else f"catalog peak {peak:g} GB/s per direction")
        for col in ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "% of peak"):
            t.add_column(col, justify="right")
        for r in (r for r in rows if r.op == op):
            t.add_row(_size(r.bytes), f"{r.seconds * 1e6:,.1f}", f"{r.algbw_gbps:.3f}",
                      f"{r.busbw_gbps:.3f}", "-" if on_cpu or not peak else f"{r.busbw_gbps / peak:.0%}")
        console.print(t)


# -- scaling ------------------------------------------------------------------------------------
def _run_once(cluster: str, script: str, workers: int, script_args: list[str], name: str,
              run_options: list[str]) -> dict[str, Any]:
    """One `gpufleet run` at `workers` workers; its job row (status, samples/s) when it ends."""
    from gpufleet.lifecycle import jobs

    argv = [sys.executable, "-m", "gpufleet.cli", "run", script, "--cluster", cluster,
            "--workers-per-node", str(workers), "--name", name, "--yes", *run_options,
            "--", *script_args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=False)
    try:
        output, _ = proc.communicate()
    except BaseException:  # Ctrl-C: the run's own handler stops its job; wait for it
        proc.wait()
        raise
    tail = output.decode(errors="replace").splitlines()[-8:]
    try:
        job = jobs.get(Store(), name)
    except NotFoundError:  # `run` refused before making the job: its own message says why
        return {"workers": workers, "status": "not started", "samples_per_s": None,
                "exit": proc.returncode, "tail": tail}
    return {"workers": workers, "status": job.status, "samples_per_s": job.samples_per_s,
            "exit": proc.returncode, "tail": tail}


def scaling(name: str, script: str, workers: list[int], script_args: list[str], model: Model | None,
            seq: int | None, out: Path | None, as_json: bool, strategy: str, precision: str,
            cpu_slots: int | None, console: Console) -> None:
    store = Store()
    c, placement = _cluster(store, name)
    path = out or default_out(c.name)
    check_out(path)
    have = len(placement.devices)
    problems = []
    too_many = [w for w in workers if w > have]
    if too_many:
        problems.append(("workers", f"{', '.join(map(str, too_many))} exceed the {have} devices of "
                         f"'{name}'; allowed: 1 to {have}"))
    if Path(script).is_dir():
        problems.append(("script", f"{script} is a directory, not a script"))
    elif not Path(script).is_file():
        problems.append(("script", f"{script}: no such file"))
    if model is not None and 1 not in workers:
        problems.append(("workers", "include 1 to calibrate the compute rate: a 1-worker run has "
                         "no communication in it (e.g. --workers 1,2,4)"))
    if problems:
        raise SpecError(problems)
    stamp = uuid.uuid4().hex[:6]
    results = []
    for w in workers:
        # unique per bench run, so a job of an earlier run can never be read as this one's
        job_name = f"bench-{c.name[:22].rstrip('-')}-{w}w-{stamp}"
        if not as_json:
            console.print(f"Running {script} on {w} worker(s) as job {job_name} ...")
        options = ["--strategy", strategy, "--precision", precision]
        if cpu_slots is not None:
            options += ["--cpu-slots", str(cpu_slots)]
        r = _run_once(c.name, script, w, script_args, job_name, options)
        if r["status"] != JobStatus.SUCCEEDED or not r["samples_per_s"]:
            tail = " | ".join(line.strip() for line in r["tail"] if line.strip())
            raise GpufleetError(f"bench: job {job_name} ({w} workers) ended {r['status']} "
                                f"without a throughput (does the script call train.report?): {tail}")
        results.append(r)
    base = results[0]
    book = c.price_book or cost.default_book(c.gpu, have, c.network)
    book_rates = {w: cost.cluster_rate(c.gpu, w, c.network, book) if book else None for w in workers}
    host_cpus = os.cpu_count() or 1
    flops_per_sample = None
    if model is not None:
        tokens = seq or model.max_seq
        attention = compute.attention_flops_per_token(model.layers, model.hidden, tokens)
        flops_per_sample = compute.flops_per_token(model.params, model.params, "none", attention) * tokens
    points = []
    for r in results:
        rate = book_rates[r["workers"]]
        per_1k = rate.usd_per_hour / 3600 * 1000 / r["samples_per_s"] if rate else None
        tflops = (r["samples_per_s"] * flops_per_sample / r["workers"] / 1e12
                  if flops_per_sample is not None else None)
        points.append(calib.ScalingPoint(workers=r["workers"], samples_per_s=r["samples_per_s"],
                                         usd_per_1k_samples=per_1k, tflops_per_device=tflops))
    achieved = points[0].tflops_per_device
    threads = max(1, host_cpus // base["workers"]) if c.gpu == "cpu" and achieved is not None else None
    new = calib.Calibration(gpu=c.gpu, network=c.network, host_cpus=host_cpus, achieved_tflops=achieved,
                            threads_per_worker=threads, precision=precision, scaling=tuple(points),
                            scaling_script=" ".join([script, *script_args]),
                            notes=(f"bench scaling on cluster {c.name}, {time.strftime('%Y-%m-%d %H:%M')}",))
    saved = save(path, new)
    rows = [{"workers": p.workers, "samples_per_s": p.samples_per_s,
             "speedup": p.samples_per_s / base["samples_per_s"],
             "scaling_efficiency": p.samples_per_s / base["samples_per_s"] * base["workers"] / p.workers,
             "usd_per_1k_samples": p.usd_per_1k_samples} for p in points]
    if as_json:
        sys.stdout.write(json.dumps({"cluster": c.name, "script": saved.scaling_script, "rows": rows,
                                     "achieved_tflops": achieved, "calibration": str(path)}, indent=2) + "\n")
        return
    t = Table(title=f"{script} on {c.name} ({c.gpu}, {network_shown(c.gpu, c.network)}, "
              f"{book or 'no'} prices)",
              title_justify="left")
    for col in ("workers", "samples/s", "speedup", "scaling efficiency", "$ per 1,000 samples"):
        t.add_column(col, justify="right")
    for row in rows:
        usd = row["usd_per_1k_samples"]
        t.add_row(str(row["workers"]), f"{row['samples_per_s']:,.1f}", f"{row['speedup']:.2f}x",
                  f"{row['scaling_efficiency']:.0%}", "-" if usd is None else f"{usd:.5f}")
    t.caption = f"efficiency against {base['workers']} worker(s); samples/s is each job's steady rate"
    console.print(t)
    if achieved is not None:
        console.print(f"Sustained {achieved * 1e3:,.2f} GFLOP/s per device at {base['workers']} worker(s) "
                      f"({model.name if model else ''}: 6 x params + attention, per token).")
    console.print(f"Calibration saved to {path}; use it: gpufleet plan ... --calibration {path}")

