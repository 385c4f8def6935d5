"""The team server under load: many clients launching, queueing, listing and cancelling at once.

    .venv/bin/python bench/server_load.py [--clients 100] [--duration 60] [--json FILE]

What it does, and why:

1. A real `gpufleet server` (its own $GPUFLEET_HOME in a temporary folder, the SQLite store) whose
   default pool is a synthetic one (`--shape`, default 2,000 nodes x 8 H100: 16,000 devices),
   with `--users` users in two teams. This host's pool (`--cpu-slots` CPU slots) is filled
   first by a cluster launched from the CLI, so every job submitted through the API must queue
   and none ever runs: the queue grows and shrinks, the server's loop plans it every beat.
2. `--clients` client threads in this process (not the server's), each a user's keep-alive
   HTTP connection (bench/load_clients.py), for `--duration` seconds, each looping: POST
   /api/v1/clusters (1-8 H100 on a node, or 16 on 2 whole nodes, on the sim pool), POST
   /api/v1/jobs (a job on the local pool, which must answer "queued"), GET /api/v1/jobs, GET
   /api/v1/clusters, POST /api/v1/jobs/NAME/cancel, and DELETE /api/v1/clusters/NAME of its
   oldest cluster once it holds more than `--hold`. `--pause S` waits about S seconds
   (uniform 0.5-1.5 S) before each request; 0 is a closed loop: each client sends its next
   request as soon as it has its answer, which measures the server's saturation.
3. Per operation: count, latency percentiles (p50, p95, p99, max; from sending to the whole
   answer read, so it includes waiting in this process), expected refusals (a launch the pool
   cannot meet: 409) and errors (any other non-2xx, or a 2xx saying the wrong thing). The
   server's RSS every second (psutil), and its peak.
4. No device given twice, checked twice over (see load_clients.py): the launches' answers
   against the clusters not yet asked to stop, and every second a consistent read of the
   store's reservations and running clusters; at the end the store's running clusters must be
   exactly the clients' with exactly the devices their launches answered.

`--profile FILE` runs the server under a stack sampler (bench/workers/sampled_server.py) and
writes where its threads spent their time. Every process started here (the server, the CLI
calls) is ended by pid however the run ends, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from load_clients import OPS, Api, Client, Grants, Sampler, Tally, sample
from procs import CLI, ROOT, cli, end_tree

SHAPES = ["2000xH100-SXM:8:infiniband"]
TARGET_P99_MS = 100.0  # list and submit, from the issue
TARGET_RSS_MB = 300.0


def env_for(home: Path, cpu_slots: int, src: Path, profile: Path | None) -> dict[str, str]:
    """The server's and the CLI's environment: gpufleet from `src` (this checkout's, or an
    older one's to compare with), nothing of the caller's own gpufleet settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(GPUFLEET_HOME=str(home), GPUFLEET_CPU_SLOTS=str(cpu_slots), PYTHONPATH=str(src),
               PYTHONDONTWRITEBYTECODE="1")
    if profile is not None:
        env["GPUFLEET_PROFILE_OUT"] = str(profile)
        env["GPUFLEET_PROFILE_MODE"] = os.environ.get("GPUFLEET_PROFILE_MODE", "")
    return env


def start_server(env: dict[str, str], profile: bool) -> tuple[subprocess.Popen[str], str]:
    first = [sys.executable, str(ROOT / "bench/workers/sampled_server.py")] if profile else CLI
    proc = subprocess.Popen([*first, "server", "--port", "0"], env=env, cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    said: list[str] = []
    try:
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            said.append(line)
            found = re.search(r"gpufleet server on (http://\S+)", line)
            if found:
                threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep it drained
                url = found.group(1)
                while time.monotonic() < deadline:  # it says so once bound, before it listens
                    try:
                        urllib.request.urlopen(url + "/api/v1/version", timeout=5).close()
                        return proc, url
                    except OSError:
                        time.sleep(0.1)
                break
            if not line and proc.poll() is not None:
                break
    except BaseException:  # Ctrl-C while it starts: end it, then go on ending
        end_tree(proc.pid)
        raise
    end_tree(proc.pid)
    raise RuntimeError("the server did not start:\n" + "".join(said))


def admin_call(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) in milliseconds."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return 1000 * s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


def machine() -> str:
    model = "?"
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                     .splitlines() if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.2f} at the end")


def verdict(tally: Tally, grants: Grants, sampler: Sampler, final_problems: list[str],
            wall_s: float, args: argparse.Namespace, cycles: int) -> dict[str, Any]:
    ops = {}
    for op in OPS:
        xs = tally.seconds[op]
        ops[op] = {"count": len(xs), "refused": tally.refused[op],
                   "errors": sum(1 for e in tally.errors if e.startswith(op + ":")),
                   "p50_ms": pct(xs, 50), "p95_ms": pct(xs, 95), "p99_ms": pct(xs, 99),
                   "max_ms": 1000 * max(xs) if xs else float("nan")}
    rss = [b for _, b in sampler.rss]
    t0 = min((at for at, _, _ in tally.calls), default=0.0)
    by_second: dict[int, list[float]] = {}
    for at, _op, took in tally.calls:
        by_second.setdefault(int(at - t0), []).append(took)
    during = [p for s in sampler.samples for p in s.problems]
    requests = sum(len(v) for v in tally.seconds.values())
    gated = ("launch", "submit", "list_jobs", "list_clusters")
    return {
        "src": args.src, "clients": args.clients, "duration_s": args.duration, "pause_s": args.pause,
        "hold": args.hold, "users": args.users, "shapes": args.shape, "wall_s": wall_s,
        "cycles": cycles, "requests": requests, "requests_per_s": requests / wall_s,
        "ops": ops, "errors": len(tally.errors), "error_examples": sorted(set(tally.errors))[:20],
        "server_cpu_s": sampler.cpu_s[-1] - sampler.cpu_s[0] if sampler.cpu_s else None,
        "server_cpu_ms_per_request": (1000 * (sampler.cpu_s[-1] - sampler.cpu_s[0]) / requests
                                      if sampler.cpu_s and requests else None),
        "rss_mb_start": rss[0] / 2**20 if rss else None,
        "rss_mb_peak": max(rss) / 2**20 if rss else None,
        "rss_mb_end": rss[-1] / 2**20 if rss else None,
        "samples": len(sampler.samples), "sample_failures": sampler.failures,
        "max_running_clusters": max((s.clusters for s in sampler.samples), default=0),
        "max_reservations": max((s.reservations for s in sampler.samples), default=0),
        "granted": grants.granted, "given_twice": grants.twice + during,
        "final_problems": final_problems,
        "targets": {
            "p99_under_100ms": all(ops[op]["p99_ms"] < TARGET_P99_MS for op in gated),
            "rss_under_300mb": bool(rss) and max(rss) / 2**20 < TARGET_RSS_MB,
            "no_device_twice": not (grants.twice or during or final_problems),
        },
        "machine": machine(),
        # per second of the run: requests sent, and the slowest of them (ms)
        "timeline": [[s, len(xs), round(1000 * max(xs), 1)] for s, xs in sorted(by_second.items())],
    }


def final_check(db: Path, grants: Grants) -> list[str]:
    """The store's running clusters (but the one holding this host) are the clients', each with
    the devices its launch answered."""
    last = sample(db, time.time())
    problems = list(last.problems)
    theirs = {n: d for n, d in last.held.items() if n != "hold"}
    for name in sorted(set(theirs) ^ set(grants.held)):
        where = "the store" if name in theirs else "the clients"
        problems.append(f"cluster {name} is running only as {where} see it")
    for name in sorted(set(theirs) & set(grants.held)):
        if theirs[name] != grants.held[name]:
            problems.append(f"cluster {name}: the store holds other devices than it was given")
    return problems


def show(r: dict[str, Any]) -> None:
    print(f"\n{r['clients']} clients x {r['wall_s']:.0f} s (pause {r['pause_s']} s, hold "
          f"{r['hold']}), {r['users']} users, pool {' + '.join(r['shapes'])}; "
          f"{r['requests']} requests ({r['requests_per_s']:.0f}/s), {r['cycles']} cycles")
    print(f"{'operation':<14}{'count':>7}{'refused':>9}{'errors':>8}{'p50 ms':>9}{'p95 ms':>9}"
          f"{'p99 ms':>9}{'max ms':>9}")
    for op, o in r["ops"].items():
        print(f"{op:<14}{o['count']:>7}{o['refused']:>9}{o['errors']:>8}{o['p50_ms']:>9.1f}"
              f"{o['p95_ms']:>9.1f}{o['p99_ms']:>9.1f}{o['max_ms']:>9.1f}")
    print(f"server RSS: {r['rss_mb_start']:.0f} MB at the start, {r['rss_mb_peak']:.0f} MB peak, "
          f"{r['rss_mb_end']:.0f} MB at the end; server CPU {r['server_cpu_s']:.1f} s "
          f"({r['server_cpu_ms_per_request']:.1f} ms per request)")
    print(f"store sampled {r['samples']} times: up to {r['max_running_clusters']} running "
          f"clusters, {r['max_reservations']} reservations; {r['granted']} launches granted; "
          f"devices given twice: {len(r['given_twice'])}; final check: "
          f"{'ok' if not r['final_problems'] else r['final_problems'][:5]}")
    for e in r["error_examples"]:
        print(f"  error: {e}")
    for p in r["given_twice"][:10]:
        print(f"  TWICE: {p}")
    print(f"targets: {r['targets']}\nmachine: {r['machine']}")


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    home = tmp / "home"
    home.mkdir()
    profile = Path(args.profile).resolve() if args.profile else None
    env = env_for(home, args.cpu_slots, Path(args.src).resolve(), profile)
    script = tmp / "trivial.py"
    script.write_text("print('never runs: the local pool is held')\n")
    cli(env, "pool", "add", "sim", *[a for s in args.shape for a in ("--shape", s)])
    cli(env, "launch", "--gpu", "cpu", "--count", str(args.cpu_slots), "--pool", "local",
        "--name", "hold", "--yes")
    proc, url = start_server(env, profile is not None)
    stop = threading.Event()
    clients: list[Client] = []
    try:
        admin = (home / "admin-token").read_text().strip()
        tokens = [admin_call(url, admin, "POST", "/api/v1/admin/users",
                             {"name": f"user{i}", "team": f"team{i % 2}"})["token"]
                  for i in range(args.users)]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        grants = Grants()
        sampler = Sampler(home / "state.db", proc.pid, stop)
        sampler.once()
        clients = [Client(i, Api(host, int(port), tokens[i % args.users]), grants, str(script),
                          args.pause, args.hold, stop, args.seed * 1000 + i)
                   for i in range(args.clients)]
        started = time.monotonic()
        sampler.start()
        for c in clients:
            c.start()
        stop.wait(args.duration)
        stop.set()
        for c in clients:
            c.join(timeout=150)
        wall = time.monotonic() - started
        sampler.join(timeout=10)
        sampler.once()
        tally = Tally()
        for c in clients:
            tally.merge(c.tally)
            if c.is_alive():
                tally.errors.append(f"client: {c.name} still waiting for an answer at the end")
        result = verdict(tally, grants, sampler, final_check(home / "state.db", grants), wall,
                         args, sum(c.cycles for c in clients))
    finally:
        stop.set()
        end_tree(proc.pid)
    if profile is not None:
        print(f"server profile: {profile}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds a client waits before each request (about; 0: closed loop)")
    ap.add_argument("--hold", type=int, default=1, help="clusters a client keeps running")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--shape", action="append", help=f"sim pool shape (default {SHAPES[0]})")
    ap.add_argument("--cpu-slots", type=int, default=2, help="this host's pool, held throughout")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--profile", help="sample the server's stacks into this file "
                    "(GPUFLEET_PROFILE_MODE=cpu: cProfile by thread CPU time instead)")
    ap.add_argument("--src", default=str(ROOT / "src"),
                    help="the gpufleet source the server runs (e.g. an older commit's, unpacked "
                    "with git archive), to compare")
    args = ap.parse_args()
    args.shape = args.shape or SHAPES

    def interrupted(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        with tempfile.TemporaryDirectory(prefix="gf-load-") as tmp:
            result = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted: the server and the clients are stopped", file=sys.stderr)
        sys.exit(130)
    show(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0 if all(result["targets"].values()) else 1)


if __name__ == "__main__":
    main()
