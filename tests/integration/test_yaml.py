"""YAML files for clusters and jobs, with flags overriding the file: the same spec models as the
flags, so the same rules and errors."""

from __future__ import annotations

from pathlib import Path

from fleet_helpers import EXAMPLES, Fleet, error_lines


def test_cluster_yaml_with_flag_override(fleet: Fleet) -> None:
    spec = fleet.cwd / "cluster.yaml"
    spec.write_text("gpu: cpu\ncount: 1\nname: from-file\n")
    fleet.ok("launch", "-f", str(spec), "-y")
    fleet.ok("launch", "-f", str(spec), "--name", "bigger", "--count", "1", "-y")
    got = {c["name"]: c for c in fleet.clusters()}
    assert set(got) == {"from-file", "bigger"}
    assert got["from-file"]["count"] == 1 and got["from-file"]["devices"] == ["cpu0"]
    assert got["bigger"]["devices"] == ["cpu1"]

    spec.write_text("gpu: cpu\ncount: 1\nflavor: large\n")
    r = fleet("launch", "-f", str(spec), "-y")
    assert r.returncode == 2
    assert error_lines(r.stderr) == ["error: flavor: unknown field"]


def test_launch_without_gpu_says_it_is_required(fleet: Fleet) -> None:
    r = fleet("launch", "-y")
    assert r.returncode == 2
    [line] = error_lines(r.stderr)
    assert line.startswith("error: gpu: is required")


def test_job_yaml_runs_with_numbers_as_strings(fleet: Fleet, tmp_path: Path) -> None:
    job = fleet.cwd / "job.yaml"
    # YAML reads 6 and 1 as numbers: args and env values still reach the worker as strings.
    job.write_text(f"script: {EXAMPLES / 'mlp.py'}\nname: yaml-job\nargs: [--steps, 6]\n"
                   "cluster: {gpu: cpu, count: 2}\nenv: {SOME_FLAG: 1}\n")
    r = fleet("run", "-f", str(job), "-y", timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s = fleet.status("yaml-job")
    assert s["status"] == "succeeded" and s["step"] == s["total_steps"] == 6
    assert fleet.clusters() == [], "the cluster made for the job is stopped with it"
