"""How long training is blocked per checkpoint: sync vs async, staggered vs simultaneous writes.

Starts 4 gloo ranks (`torchrun --standalone --nproc-per-node 4`) on bench/workers/ckpt_worker.py:
a DDP model of Linear layers sized so that its fp32 parameters plus Adam's two moments are about
`--state-mb` MB, trained a few real optimizer steps, then checkpointed through
`gpufleet.train.Checkpointer` in four modes, each with its own Checkpointer and folder:

- sync or async (`async_save=True`: training waits only while the state is copied to CPU);
- simultaneous (`writers=None`: all 4 ranks of the node write at once) or staggered
  (`writers=1`: one rank of the node writes at a time).

The modes take turns save by save, in a rotating order, so the noise of a shared machine falls
on all of them alike; one training step runs between saves. Per save it takes, over the ranks,
the longest time training was blocked (`Checkpointer.blocked_s`; DDP's next all-reduce makes
every rank wait for the slowest) and the longest time from `save()` to `wait()` returning
(the checkpoint complete and visible; nothing trains in between, so for async this is the
background write's own duration, uncontended by training). The table gives the median over
`--saves` saves per mode (after `--warmup-saves` untimed ones), the checkpoint size, and the
ratios async/sync and staggered/simultaneous. GPUFLEET_TELEMETRY=0 for the workers, and the
supervisor's GPUFLEET_CHECKPOINT_DIR / GPUFLEET_CONTROL_FILE are kept out of their environment.

    .venv/bin/python bench/checkpoint.py [--saves 5] [--state-mb 75] [--json out.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from procs import end_tree

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "bench" / "workers" / "ckpt_worker.py"
MODES = ["sync-simultaneous", "sync-staggered", "async-simultaneous", "async-staggered"]
_SCRUB = ("GPUFLEET_CONTROL_FILE", "GPUFLEET_CHECKPOINT_DIR", "GPUFLEET_CHECKPOINT_TO",
          "GPUFLEET_REPORT_ADDR", "GPUFLEET_JOB", "GPUFLEET_JOB_DIR")


def run_worker(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out = tmp / "results.json"
    log = tmp / "torchrun.log"
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(GPUFLEET_TELEMETRY="0", PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(args.ranks), str(WORKER),
            "--root", str(tmp / "ckpt"), "--out", str(out), "--state-mb", str(args.state_mb),
            "--width", str(args.width), "--saves", str(args.saves),
            "--warmup-saves", str(args.warmup_saves), "--train-steps", str(args.train_steps)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except BaseException:  # a timeout or Ctrl-C: leave nothing running
            end_tree(proc.pid)
            proc.wait()
            raise
        finally:
            end_tree(proc.pid)  # nothing should be left; just in case
    if code != 0 or not out.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"the worker failed ({code}):\n{tail}")
    return dict(json.loads(out.read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saves", type=int, default=5, help="timed saves per mode (median of these)")
    ap.add_argument("--warmup-saves", type=int, default=1, help="untimed saves per mode first")
    ap.add_argument("--state-mb", type=float, default=75.0,
                    help="fp32 params + Adam state of the model, in MB (the checkpoint's size)")
    ap.add_argument("--width", type=int, default=1024, help="width of the Linear layers")
    ap.add_argument("--train-steps", type=int, default=3, help="optimizer steps before saving")
    ap.add_argument("--ranks", type=int, default=4, help="gloo ranks on this node")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where the temporary checkpoint folders go [default: the system temp]")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds before giving up")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: a 12 MB model, 2 saves per mode, no warm-up save")
    args = ap.parse_args()
    if args.quick:
        args.saves, args.warmup_saves, args.state_mb, args.width = 2, 0, 12.0, 512
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-ckpt-", dir=args.dir) as tmp:
        res = run_worker(args, Path(tmp))
        fs = _filesystem(Path(tmp))
    wall = time.monotonic() - started
    timed = [s for s in res["saves"] if not s["warmup"]]

    def med(mode: str, key: str) -> float:
        return float(statistics.median(max(s[key]) for s in timed if s["mode"] == mode))

    def size_mb(mode: str) -> float:
        return float(statistics.median(s["bytes"] for s in timed if s["mode"] == mode)) / 1e6

    blocked = {m: med(m, "blocked_s") * 1e3 for m in MODES}
    complete = {m: med(m, "complete_s") * 1e3 for m in MODES}
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, torch {res['torch']}; {res['world_size']} gloo "
          f"ranks (DDP), {res['params'] / 1e6:.1f} M params ({res['state_bytes'] / 1e6:.0f} MB "
          f"fp32 params + Adam state); checkpoints on {fs}; median of {args.saves} saves per "
          f"mode after {args.warmup_saves} warm-up; per save the slowest rank; run took "
          f"{wall:.0f} s")
    print()
    print("| mode | async_save | writers | blocked (ms) | save to complete (ms) | checkpoint (MB) |")
    print("|---|---|---|---|---|---|")
    for m in MODES:
        writers = "1 (staggered)" if m.endswith("staggered") else f"{res['world_size']} (all at once)"
        print(f"| {m} | {m.startswith('async')} | {writers} | {blocked[m]:.0f} | "
              f"{complete[m]:.0f} | {size_mb(m):.1f} |")
    print()
    print("| ratio | blocked | save to complete |")
    print("|---|---|---|")
    for w in ("simultaneous", "staggered"):
        print(f"| async / sync, {w} | {blocked['async-' + w] / blocked['sync-' + w]:.2f} | "
              f"{complete['async-' + w] / complete['sync-' + w]:.2f} |")
    for s in ("sync", "async"):
        print(f"| staggered / simultaneous, {s} | "
              f"{blocked[s + '-staggered'] / blocked[s + '-simultaneous']:.2f} | "
              f"{complete[s + '-staggered'] / complete[s + '-simultaneous']:.2f} |")
    print()
    print("per save (ms, slowest rank), by mode in the order saved: "
          + "; ".join(f"{m}: " + ", ".join(f"{max(s['blocked_s']) * 1e3:.0f}/"
                                            f"{max(s['complete_s']) * 1e3:.0f}"
                                            for s in timed if s["mode"] == m) for m in MODES)
          + " (blocked/complete)")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


def _filesystem(path: Path) -> str:
    """The mount and filesystem type `path` is on, for the record (tmpfs vs a disk matters)."""
    best = None
    for part in psutil.disk_partitions(all=True):
        if str(path).startswith(part.mountpoint) and (best is None or
                                                      len(part.mountpoint) > len(best.mountpoint)):
            best = part
    return f"{best.mountpoint} ({best.fstype})" if best else "?"


if __name__ == "__main__":
    main()
