"""CPU time of `gpufleet --help`, `list`, `prices` and `status JOB --json` against `python -c
pass`, in one run.

Each command is a fresh `python -m gpufleet.cli` process; its CPU time (user + sys, from
`wait4`) is what the machine spends before the user sees an answer, whatever else runs beside
it. The commands take turns, `--repeats` times, and the median is reported with its ratio to a
bare interpreter start; importing typer and Rich's table, which every command needs, is the
floor a typer CLI cannot go under. The state folder is made once: a store with one stopped cluster and
one finished job (what `status` shows), and no running cluster, so `list` has nothing to ask a
pool about.

    .venv/bin/python bench/cli_startup.py [--repeats 15] [--src DIR]

`--src` runs another tree's `gpufleet` (e.g. an older commit unpacked with `git archive`) to
compare against; the state folder is always made with this tree's store.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = "startup-probe"
COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "python -c 'import typer, rich.table'": ["-c", "import typer, rich.console, rich.table"],
    "gpufleet --help": ["-m", "gpufleet.cli", "--help"],
    "gpufleet list": ["-m", "gpufleet.cli", "list"],
    "gpufleet prices": ["-m", "gpufleet.cli", "prices"],
    f"gpufleet status {JOB} --json": ["-m", "gpufleet.cli", "status", JOB, "--json"],
}


def make_home(home: Path) -> None:
    """A state folder as the store makes it, holding one stopped cluster and its ended job."""
    os.environ["GPUFLEET_HOME"] = str(home)
    sys.path.insert(0, str(ROOT / "src"))
    from gpufleet.spec import JobSpec
    from gpufleet.store import Cluster, Event, Job, Store

    store = Store()
    now = time.time()
    spec = JobSpec.parse({"script": "examples/gpt.py", "workdir": str(ROOT), "cluster": "probe"})
    with store.session() as s:
        c = Cluster(name="probe", gpu="cpu", count=2, nodes=1, network="pcie", disk_bytes=1 << 30,
                    backend="local", usd_per_hour=0.0, status="stopped", created_at=now - 60,
                    started_at=now - 60, stopped_at=now - 5, scratch_dir=str(home / "scratch"),
                    spec_json="{}")
        s.add(c)
        s.flush()
        j = Job(name=JOB, cluster_id=c.id, status="succeeded", spec_json=spec.model_dump_json(),
                job_dir=str(home / "jobs" / JOB), world_size=2, created_at=now - 50,
                started_at=now - 45, ended_at=now - 6, samples=640, step=20)
        s.add(j)
        s.flush()
        s.add(Event(job_id=j.id, time=now - 6, kind="succeeded", reason="exit code 0"))
    store.close()


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """User + sys CPU seconds of one run of `argv` (which must succeed)."""
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {err}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the gpufleet tree to run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gf-startup-") as tmp:
        make_home(Path(tmp) / "home")
        # Bytecode is written (under a prefix of our own), as an installed package has it.
        env = {**{k: v for k, v in os.environ.items()
                  if not k.startswith("GPUFLEET_") and k != "PYTHONDONTWRITEBYTECODE"},
               "GPUFLEET_HOME": str(Path(tmp) / "home"), "PYTHONPATH": str(args.src.resolve()),
               "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache"), "COLUMNS": "120"}
        for argv in COMMANDS.values():  # compile bytecode, warm the page cache
            cpu_seconds([sys.executable, *argv], env)
        runs: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(args.repeats):
            for name, argv in COMMANDS.items():
                runs[name].append(cpu_seconds([sys.executable, *argv], env))
    base = statistics.median(runs["python -c pass"])
    print(f"src: {args.src}   repeats: {args.repeats}   cpus: {os.cpu_count()}   "
          f"python: {sys.version.split()[0]}")
    print("| command | CPU s (median) | min | max | vs python -c pass |")
    print("|---|---|---|---|---|")
    for name, values in runs.items():
        med = statistics.median(values)
        print(f"| `{name}` | {med:.3f} | {min(values):.3f} | {max(values):.3f} | "
              f"{med / base:.1f}x (+{med - base:.3f} s) |")


if __name__ == "__main__":
    main()
