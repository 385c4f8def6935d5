"""Frameworks through the real CLI: DeepSpeed, Accelerate and Ray Train running the example GPT on
CPU slots, `--dry-run` for every framework, and the preflight refusals that reserve nothing."""

from __future__ import annotations

import json
import shlex
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from fleet_helpers import EXAMPLES, Fleet, error_lines, tracebacks_not_rays

GPT = str(EXAMPLES / "gpt.py")
# The example GPT at its default shape (2 layers, 4 heads, so the preflight checks bite), trained
# just long enough to log a loss twice: about 10-30 s per run on 2 CPU cores.
SMALL = ["--steps", "6", "--log-every", "3", "--max-bytes", "300000", "--sample-bytes", "10",
         "--batch-size", "16", "--val-windows", "8"]
RUN_TIMEOUT = 240
RAY_MARKERS = ("ray::", "raylet", "gcs_server")


def run_gpt(fleet: Fleet, name: str, *flags: str, script: str = GPT, count: int = 2,
            args: list[str] = SMALL) -> subprocess.CompletedProcess[str]:
    r = fleet("run", script, "--gpu", "cpu", "--count", str(count), "--name", name, "-y", *flags,
              "--", *args, timeout=RUN_TIMEOUT)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert "Traceback" not in r.stdout + r.stderr
    return r


def job_dir(fleet: Fleet, name: str) -> Path:
    return fleet.home / "jobs" / name


def reservations(home: Path) -> int:
    if not (home / "state.db").exists():
        return 0
    with sqlite3.connect(home / "state.db") as db:
        count: int = db.execute("select count(*) from reservations").fetchone()[0]
    return count


def jobs_made(home: Path) -> list[str]:
    folder = home / "jobs"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def assert_nothing_reserved(fleet: Fleet) -> None:
    assert fleet.clusters(all_=True) == [], "no cluster made, not even a stopped one"
    assert reservations(fleet.home) == 0
    assert jobs_made(fleet.home) == []


def assert_succeeded_and_freed(fleet: Fleet, name: str, r: subprocess.CompletedProcess[str]) -> None:
    assert "final loss" in r.stdout
    s = fleet.status(name)
    assert s["status"] == "succeeded", s
    assert s["world_size"] == 2
    assert s["step"] == s["total_steps"] == 6
    assert fleet.clusters() == [], "the job's own cluster is freed"


# ---------------------------------------------------------------- real runs: deepspeed, accelerate


def test_deepspeed_zero2_trains_with_its_config(fleet: Fleet) -> None:
    r = run_gpt(fleet, "ds-zero2", "--framework", "deepspeed", "--strategy", "zero2")
    assert "zero2, dp=2" in r.stdout
    assert_succeeded_and_freed(fleet, "ds-zero2", r)
    config = json.loads((job_dir(fleet, "ds-zero2") / "ds_config.json").read_text())
    assert config["zero_optimization"]["stage"] == 2
    assert "bf16" not in config and "fp16" not in config


def test_accelerate_fsdp_trains_with_its_config(fleet: Fleet) -> None:
    r = run_gpt(fleet, "acc-fsdp", "--framework", "accelerate", "--strategy", "fsdp")
    assert "fsdp, dp=2" in r.stdout
    assert_succeeded_and_freed(fleet, "acc-fsdp", r)
    config = yaml.safe_load((job_dir(fleet, "acc-fsdp") / "accelerate.yaml").read_text())
    assert config["distributed_type"] == "FSDP"
    assert config["fsdp_config"]["fsdp_version"] == 2
    assert config["num_processes"] == 2
    assert config["use_cpu"] is True
    for rank in (0, 1):
        assert (job_dir(fleet, "acc-fsdp") / "logs" / f"rank{rank}.log").exists()


def test_torchrun_pipeline_in_bf16(fleet: Fleet) -> None:
    r = run_gpt(fleet, "pp-bf16", "--strategy", "pp", "--precision", "bf16-mixed")
    assert "pp, dp=1 x tp=1 x pp=2" in r.stdout
    assert "bf16-mixed" in r.stdout
    assert_succeeded_and_freed(fleet, "pp-bf16", r)
    assert not (job_dir(fleet, "pp-bf16") / "ds_config.json").exists()
    assert not (job_dir(fleet, "pp-bf16") / "accelerate.yaml").exists()


# ---------------------------------------------------------------- real run: Ray Train

# The example GPT prints on rank 0 only; this wrapper adds one line per rank, so both rank logs
# show whether Ray's output is split per rank. It then runs the example unchanged.
RAY_WRAPPER = """\
import os, runpy, sys
print(f"hello from rank {{os.environ['RANK']}} pid {{os.getpid()}}", flush=True)
sys.argv[0] = {gpt!r}
runpy.run_path({gpt!r}, run_name="__main__")
"""


def ray_pids() -> set[int]:
    found = set()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        if any(m in cmd for m in RAY_MARKERS):
            found.add(p.pid)
    return found


def _home_of(p: psutil.Process) -> str | None:
    try:
        return p.environ().get("GPUFLEET_HOME")
    except psutil.Error:
        return None


def _orphan_of(p: psutil.Process, home: str) -> bool:
    """An orphaned (daemonized) process that names this run's home in its environment (the
    private Ray's token path is under the job folder) or its command line."""
    try:
        return p.ppid() in (0, 1) and (
            any(home in v for v in p.environ().values()) or home in " ".join(p.cmdline()))
    except psutil.Error:
        return False


def ray_leftovers(before: set[int], home: Path, timeout: float = 10.0) -> list[str]:
    """Ray processes that were not there before the run and still live after `timeout`, and are
    the run's: started under its GPUFLEET_HOME, the child of such a process (Ray's agents drop
    the variable), or orphaned naming its home. Another session's Ray, which may start
    meanwhile (the test machines' raylets, daemonized too, run beside this module), is not
    ours."""
    deadline = time.monotonic() + timeout
    while True:
        ours = []
        for pid in ray_pids() - before:
            try:
                p = psutil.Process(pid)
                chain = [p, *p.parents()]
                mine = any(_home_of(q) == str(home) for q in chain) or _orphan_of(p, str(home))
                if mine:
                    ours.append(f"{pid}: {' '.join(p.cmdline())[:200]}")
            except psutil.Error:
                continue
        if not ours or time.monotonic() > deadline:
            return ours
        time.sleep(0.3)


@dataclass
class RayRun:
    fleet: Fleet
    result: subprocess.CompletedProcess[str]
    status: dict[str, Any]
    ray_left: list[str]


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayRun]:
    """One 2-worker Ray Train run of the GPT (through the wrapper), shared by the tests below."""
    base = tmp_path_factory.mktemp("ray")
    f = Fleet(base / "home", base / "cwd", slots=2)
    wrapper = f.cwd / "ray_gpt.py"
    wrapper.write_text(RAY_WRAPPER.format(gpt=GPT))
    before = ray_pids()
    try:
        result = f("run", str(wrapper), "--gpu", "cpu", "--count", "2", "--name", "ray-ddp",
                   "--framework", "ray", "--strategy", "ddp", "-y", "--", *SMALL, timeout=RUN_TIMEOUT)
        run = RayRun(f, result, f.status("ray-ddp"), ray_leftovers(before, f.home))
    except BaseException:
        f.cleanup()
        raise
    yield run
    left = f.cleanup()
    assert not left, f"processes left behind: {left}"


def test_ray_ddp_trains(ray_run: RayRun) -> None:
    r = ray_run.result
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert tracebacks_not_rays(r.stdout + r.stderr) == []
    assert "ddp, dp=2" in r.stdout
    assert "final loss" in r.stdout
    s = ray_run.status
    assert s["status"] == "succeeded", s
    assert s["step"] == s["total_steps"] == 6
    assert ray_run.fleet.clusters() == []
    assert (job_dir(ray_run.fleet, "ray-ddp") / "ray").is_dir(), "Ray Train's storage in the job folder"


def test_ray_output_is_split_per_rank(ray_run: RayRun) -> None:
    assert ray_run.result.returncode == 0
    logs = job_dir(ray_run.fleet, "ray-ddp") / "logs"
    for rank in (0, 1):
        lines = (logs / f"rank{rank}.log").read_text().splitlines()
        assert lines, f"rank {rank} has an empty log"
        assert any(ln.startswith(f"hello from rank {rank} ") for ln in lines), lines
        assert not any("RayTrainWorker" in ln or "[rank" in ln for ln in lines), lines[:5]
    rank0 = (logs / "rank0.log").read_text()
    rank1 = (logs / "rank1.log").read_text()
    assert "final loss" in rank0
    assert "hello from rank 1" not in rank0 and "hello from rank 0" not in rank1
    # `gpufleet logs --rank` reads the same files
    r = ray_run.fleet("logs", "ray-ddp", "--rank", "1")
    assert r.returncode == 0 and "hello from rank 1" in r.stdout


def test_ray_prints_each_line_once(ray_run: RayRun) -> None:
    assert ray_run.result.returncode == 0
    logs = job_dir(ray_run.fleet, "ray-ddp") / "logs"
    for rank in (0, 1):
        hellos = [ln for ln in (logs / f"rank{rank}.log").read_text().splitlines()
                  if ln.startswith("hello from rank")]
        assert len(hellos) == 1, f"rank {rank} printed one hello line; its log has {hellos}"
    finals = [ln for ln in (logs / "rank0.log").read_text().splitlines() if ln.startswith("final loss")]
    assert len(finals) == 1, finals


def test_ray_leaves_no_ray_processes(ray_run: RayRun) -> None:
    assert ray_run.result.returncode == 0
    assert ray_run.ray_left == [], "Ray processes started by the run outlived it"


# ---------------------------------------------------------------- --dry-run

# (framework, strategy, what the command runs, files it writes in the job folder)
DRY_RUNS = [
    ("torchrun", "fsdp", ["-m", "torch.distributed.run"], []),
    ("accelerate", "zero3", ["-m", "accelerate.commands.launch", "--config_file"], ["accelerate.yaml"]),
    ("deepspeed", "zero2", ["-m", "torch.distributed.run"], ["ds_config.json"]),
    ("ray", "ddp", ["-m", "gpufleet.launch.ray_train", "--workers", "2"], []),
    ("horovod", "ddp", ["horovodrun", "-np", "2", "-H", "localhost:2"], []),
]


def dry_run_parts(stdout: str) -> tuple[str, list[str], dict[str, str]]:
    """(header line, the command's argv, file name -> content) from `run --dry-run` output."""
    lines = stdout.splitlines()
    header = lines[0]
    argv = shlex.split(lines[lines.index("# command:") + 1])
    files: dict[str, str] = {}
    current: str | None = None
    for line in lines:
        if line.startswith("# file ") and line.endswith(":"):
            current = Path(line[len("# file "):-1]).name
            files[current] = ""
        elif line.startswith("#") or line == "":
            current = None
        elif current is not None:
            files[current] += line + "\n"
    return header, argv, files


def contains(argv: list[str], part: list[str]) -> bool:
    return any(argv[i:i + len(part)] == part for i in range(len(argv)))


@pytest.mark.parametrize(("framework", "strategy", "launcher", "files"), DRY_RUNS,
                         ids=[d[0] for d in DRY_RUNS])
def test_dry_run_prints_everything_and_starts_nothing(fleet: Fleet, framework: str, strategy: str,
                                                      launcher: list[str], files: list[str]) -> None:
    name = f"dry-{framework}"
    args = [*SMALL, "--seed", "two words"]
    # each framework's own launcher (a warm start's: tests/unit/test_warm_launch.py)
    r = fleet("run", GPT, "--gpu", "cpu", "--count", "2", "--name", name, "--framework", framework,
              "--strategy", strategy, "--dry-run", "--no-warm", "--", *args)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr
    header, argv, written = dry_run_parts(r.stdout)
    assert header.startswith(f"# dry run: job {name}, {framework}, {strategy}, dp=2"), header
    assert contains(argv, launcher), argv
    assert argv[-len(args) - 1:] == [GPT, *args]
    assert f"GPUFLEET_FRAMEWORK={framework}" in r.stdout.splitlines()
    assert f"GPUFLEET_STRATEGY={strategy}" in r.stdout.splitlines()
    assert "GPUFLEET_MESH=dp=2,tp=1,pp=1" in r.stdout.splitlines()
    assert sorted(written) == sorted(files)
    for file_name in files:
        assert f"# file {job_dir(fleet, name) / file_name}:" in r.stdout
    if framework == "deepspeed":
        assert json.loads(written["ds_config.json"])["zero_optimization"]["stage"] == 2
        assert f"GPUFLEET_DEEPSPEED_CONFIG={job_dir(fleet, name) / 'ds_config.json'}" in r.stdout
    if framework == "accelerate":
        config = yaml.safe_load(written["accelerate.yaml"])
        assert config["distributed_type"] == "FSDP"
        assert config["fsdp_config"]["fsdp_reshard_after_forward"] is True
        assert argv[argv.index("--config_file") + 1] == str(job_dir(fleet, name) / "accelerate.yaml")
    if framework == "ray":
        assert argv[argv.index("--gpus-per-worker") + 1] == "0"

    assert "Quote" not in r.stderr, "a dry run quotes nothing"
    assert_nothing_reserved(fleet)
    assert fleet("status", name, "--json").returncode == 2, "no job was recorded"


def test_dry_run_on_an_existing_cluster_leaves_it_idle(fleet: Fleet) -> None:
    fleet.ok("launch", "--gpu", "cpu", "--count", "2", "--name", "held", "-y")
    r = fleet("run", GPT, "--cluster", "held", "--name", "dry-held", "--framework", "deepspeed",
              "--strategy", "zero3", "--dry-run", "--", *SMALL)
    assert r.returncode == 0, r.stderr
    _, _, written = dry_run_parts(r.stdout)
    assert json.loads(written["ds_config.json"])["zero_optimization"]["stage"] == 3
    assert "GPUFLEET_CLUSTER=held" in r.stdout.splitlines()
    [c] = fleet.clusters()
    assert c["name"] == "held" and c["job"] is None and len(c["devices"]) == 2
    assert reservations(fleet.home) == 2
    assert jobs_made(fleet.home) == []
    assert fleet("status", "dry-held", "--json").returncode == 2


def test_dry_run_prints_arguments_verbatim(fleet: Fleet) -> None:
    """What the dry run shows is what would run: arguments that look like rich markup or emoji
    codes are printed as given."""
    args = ["--tag", ":fire:", "[bold]x[/bold]", "a:b:c"]
    r = fleet("run", GPT, "--gpu", "cpu", "--count", "2", "--name", "dry-verbatim", "--dry-run",
              "--", *args)
    assert r.returncode == 0, r.stderr
    _, argv, _ = dry_run_parts(r.stdout)
    assert argv[-len(args):] == args


# ---------------------------------------------------------------- preflight refusals

# (id, run flags, CPU slots, field named, hints the message holds)
REFUSED = [
    ("mesh-mismatch", ["--count", "2", "--strategy", "pp", "--pp", "4"], 2, "mesh",
     ["pp 4", "2 workers"]),
    ("more-stages-than-layers", ["--count", "4", "--strategy", "pp"], 4, "pp",
     ["4 pipeline stages", "2 layers"]),
    ("tp-splits-heads", ["--count", "3", "--strategy", "tp"], 4, "tp",
     ["degree 3", "4 attention heads", "1, 2, 4"]),
    ("horovod-fsdp", ["--count", "2", "--framework", "horovod", "--strategy", "fsdp"], 2, "strategy",
     ["horovod", "ddp", "fsdp"]),
    ("deepspeed-fp16-on-cpu", ["--count", "2", "--framework", "deepspeed", "--precision", "fp16-mixed"],
     2, "precision", ["fp16", "GPU", "bf16-mixed"]),
    ("unknown-strategy", ["--count", "2", "--strategy", "zero9"], 2, "strategy",
     ["zero9", "ddp", "fsdp", "zero1", "zero2", "zero3", "tp", "pp"]),
]


def assert_refused(fleet: Fleet, r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stdout == "", "a refused command prints nothing on stdout"
    assert "Quote" not in r.stderr, "refused before a quote is shown"
    [line] = error_lines(r.stderr)
    assert_nothing_reserved(fleet)
    return line


def check_refusal(fleet: Fleet, flags: list[str], slots: int, field: str, hints: list[str],
                  dry_run: bool = False) -> None:
    r = fleet("run", GPT, "--gpu", "cpu", *flags, "-y", *(["--dry-run"] if dry_run else []),
              "--", "--steps", "2", slots=slots)
    line = assert_refused(fleet, r)
    assert line.startswith(f"error: {field}: "), line
    for hint in hints:
        assert hint in line, (hint, line)


@pytest.mark.parametrize(("flags", "slots", "field", "hints"), [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])
def test_preflight_refuses_before_anything_is_reserved(fleet: Fleet, flags: list[str], slots: int,
                                                       field: str, hints: list[str]) -> None:
    check_refusal(fleet, flags, slots, field, hints)


@pytest.mark.parametrize(("flags", "slots", "field", "hints"),
                         [c[1:] for c in REFUSED if c[0] in ("mesh-mismatch", "horovod-fsdp")],
                         ids=["mesh-mismatch", "horovod-fsdp"])
def test_dry_run_is_refused_by_preflight_too(fleet: Fleet, flags: list[str], slots: int, field: str,
                                             hints: list[str]) -> None:
    check_refusal(fleet, flags, slots, field, hints, dry_run=True)


def test_preflight_names_every_problem_at_once(fleet: Fleet) -> None:
    r = fleet("run", GPT, "--gpu", "cpu", "--count", "2", "--framework", "deepspeed", "--strategy",
              "tp", "--precision", "fp16-mixed", "-y")
    line = assert_refused(fleet, r)
    assert "strategy: framework deepspeed runs only" in line, line
    assert "precision: DeepSpeed's fp16 needs a GPU" in line, line


def test_preflight_reads_the_model_shape_from_the_script_args(fleet: Fleet) -> None:
    # --layers 1 given to the script: even 2 stages are too many
    r = fleet("run", GPT, "--gpu", "cpu", "--count", "2", "--strategy", "pp", "-y", "--",
              "--layers", "1")
    line = assert_refused(fleet, r)
    assert "pp: 2 pipeline stages but the model has 1 layers" in line, line
