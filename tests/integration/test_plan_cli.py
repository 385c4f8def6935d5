"""`gpufleet plan` through the real CLI: the issue's own command, JSON, a plot, the ranking,
and bad input as one line with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_helpers import EXAMPLES, error_lines

CLI = [sys.executable, "-m", "gpufleet.cli"]
ISSUE = ["plan", "--model", "llama3-70b", "--gpu", "H100", "--count", "8", "--network", "nvswitch",
         "--strategy", "fsdp", "--precision", "bf16-mixed", "--micro-batch", "2", "--seq", "4096",
         "--samples", "50000"]


def gf(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_the_issue_command_prints_memory_speed_and_cost() -> None:
    r = gf(*ISSUE)
    assert r.returncode == 0, r.stderr
    for part in ("weights", "gradients", "optimizer", "activations", "buffers", "does not fit",
                 "communication, exposed", "MFU", "scaling efficiency", "marketplace", "hyperscaler",
                 "saves"):
        assert part in r.stdout, part


def test_json_has_the_promised_fields_and_they_agree() -> None:
    d = json.loads(gf(*ISSUE, "--checkpointing", "--json").stdout)
    for k in ("fits", "step_time_s", "compute_time_s", "comm_time_s", "samples_per_s", "tokens_per_s",
              "mfu", "scaling_efficiency", "wall_time_h", "cost_usd"):
        assert k in d, k
    mem = d["memory_gib"]
    parts = ("weights", "gradients", "optimizer", "activations", "buffers")
    assert mem["total"] == pytest.approx(sum(mem[p] for p in parts))
    assert d["fits"] is False  # 70.55e9 params x 16 bytes / 8 GPUs = 131 GiB of state alone
    assert mem["weights"] + mem["gradients"] + mem["optimizer"] == pytest.approx(70.55e9 * 16 / 8 / 2**30,
                                                                                 rel=1e-3)
    assert d["step_time_s"] == pytest.approx(d["compute_time_s"] + d["comm_time_s"])
    assert d["samples_per_s"] == pytest.approx(16 / d["step_time_s"])  # 2 x 8 GPUs per step
    assert d["wall_time_h"] == pytest.approx(50000 / d["samples_per_s"] / 3600)
    assert set(d["cost_usd"]) == {"marketplace", "hyperscaler"}
    assert d["cost_usd"]["marketplace"] < d["cost_usd"]["hyperscaler"]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    r = gf(*ISSUE, "--plot", str(png))
    assert r.returncode == 0, r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_deadline_ranks_cheapest_first_and_says_why_not() -> None:
    r = gf("plan", "--model", "llama3-70b", "--samples", "50000", "--deadline", "24h",
           "--checkpointing", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["by"] == "cost" and d["qualifying"] > 0 and d["considered"] > 500
    costs = [min(p["cost_usd"].values()) for p in d["ranked"]]
    assert costs == sorted(costs)
    assert all(p["fits"] and p["wall_time_h"] <= 24 for p in d["ranked"])
    assert d["rejected"]["memory"] > 0
    assert any("H100-SXM" in line and "do not fit in memory" in line for line in d["why_not"])


def test_config_json_and_list_models() -> None:
    d = json.loads(gf("plan", "--config", str(EXAMPLES / "gpt-config.json"), "--gpu", "A100",
                      "--json").stdout)
    assert d["model"]["params"] == 470528  # what examples/gpt.py prints for this shape
    listed = json.loads(gf("plan", "--list-models", "--json").stdout)
    names = {m["name"] for m in listed}
    assert {"llama3-8b", "llama3-70b", "llama3-405b", "mistral-7b", "gpt3-175b"} <= names


@pytest.mark.parametrize("args, field", [
    (["--model", "llama9", "--gpu", "H100"], "model: unknown model 'llama9'"),
    (["--model", "llama3-8b"], "gpu: is required"),
    (["--model", "llama3-8b", "--deadline", "24h"], "samples: is required"),
    (["--model", "llama3-8b", "--gpu", "H100", "--precision", "bf17"], "precision: 'bf17' is not allowed"),
    (["--model", "llama3-8b", "--gpu", "H100", "--count", "12"], "count: 12 GPUs span nodes of 8"),
    (["--model", "llama3-8b", "--gpu", "V100", "--count", "2"], "precision: V100 has no BF16"),
    (["--model", "llama3-8b", "--gpu", "H100", "--count", "8", "--strategy", "tp", "--tp", "3"], "tp"),
    (["--params", "7e9", "--config", "x.json", "--gpu", "H100"], "model: give one of"),
    (["--config", "/nonexistent/config.json", "--gpu", "H100"], "config: /nonexistent/config.json: no such"),
    (["--model", "llama3-8b", "--gpu", "H100", "--calibration", "/nonexistent.json"], "calibration:"),
    (["--model", "llama3-8b", "--gpu", "cpu"], "calibration: CPU workers have no rated peak"),
    (["--model", "llama3-8b", "--gpu", "H100", "--plot", "plan.txt"], "plot: plan.txt: the file name"),
    (["--model", "llama3-8b", "--gpu", "H100", "--plot", "/nonexistent/p.png"], "plot: /nonexistent/p.png"),
    (["--model", "llama3-8b", "--samples", "10", "--budget", "9", "--tp", "2"], "tp: a ranking chooses"),
    (["--params", "inf", "--gpu", "H100"], "params:"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], field: str) -> None:
    r = gf("plan", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and field in lines[0], r.stderr
    assert "Traceback" not in r.stderr
