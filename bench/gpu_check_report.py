"""The figures of one `bench/gpu_check.sh` run, from the files it left in its output folder:
summary.json there, and a short table on stdout.

Usage: python bench/gpu_check_report.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GIB = 2**30


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _steps(out: Path) -> dict[str, dict[str, int | str]]:
    """Each step's exit code and seconds; a step that did not run has the exit `skipped`."""
    rows: dict[str, dict[str, int | str]] = {}
    for line in (out / "steps.tsv").read_text().splitlines()[1:]:
        name, code, seconds = line.split("\t")
        rows[name] = {"exit": int(code) if code.lstrip("-").isdigit() else code,
                      "seconds": int(seconds)}
    return rows


def _job(status: Any) -> dict[str, Any] | None:
    if not isinstance(status, dict):
        return None
    keys = ("status", "layout", "world_size", "step", "total_steps", "first_loss", "loss",
            "samples_per_s", "elapsed_s", "reason")
    return {k: status.get(k) for k in keys}


def _device_readings(status: Any) -> dict[str, Any]:
    """What the supervisor's samplers stored for each device of the job, latest reading each
    (NVML on GPUs; per-worker CPU and memory on CPU slots). Ranks' and the job's are left out."""
    latest = status.get("latest") if isinstance(status, dict) else None
    if not isinstance(latest, dict):
        return {}
    return {who: readings for who, readings in latest.items()
            if not who.startswith("rank") and who != "job"}


def _memory(fsdp: Any, plan: Any) -> dict[str, Any]:
    """Measured peak CUDA memory per rank against the planner's per-GPU memory."""
    state = (fsdp or {}).get("model_state") or {}
    peaks = [r.get("cuda_max_allocated_bytes") for r in state.values()
             if r.get("cuda_max_allocated_bytes")]
    planned = (plan or {}).get("memory_gib") or {}
    result: dict[str, Any] = {"planned_gib": planned, "measured_peak_gib_per_rank":
                              [round(p / GIB, 3) for p in peaks]}
    if peaks and planned.get("total"):
        peak = max(peaks) / GIB
        without_buffers = planned["total"] - planned.get("buffers", 0.0)
        result["measured_over_planned_total"] = round(peak / planned["total"], 3)
        if without_buffers > 0:
            result["measured_over_planned_state_and_activations"] = round(peak / without_buffers, 3)
    return result


def main(out: Path) -> int:
    calibration = _load(out / "calibration.json")
    doctor = _load(out / "doctor.json")
    summary = {
        "machine": (out / "machine.txt").read_text().strip() if (out / "machine.txt").exists()
        else None,
        "versions": (out / "versions.log").read_text().strip()
        if (out / "versions.log").exists() else None,
        "steps": _steps(out),
        "demo": _job(_load(out / "demo-status.json")),
        "doctor": doctor,
        "allreduce": calibration,
        "fsdp": _job(_load(out / "fsdp-status.json")),
        "fsdp_memory": _memory(_load(out / "fsdp-status.json"), _load(out / "plan.json")),
        "fsdp_nvml_while_running": _device_readings(_load(out / "fsdp-status-running.json")),
        "demo_image": _job(_load(out / "demo-image-status.json")),
        "image_leftovers": (out / "image-leftovers.txt").read_text().split()
        if (out / "image-leftovers.txt").exists() else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for name, row in summary["steps"].items():
        print(f"{name:12} exit {row['exit']!s:>7}  {row['seconds']:4} s")
    for name in ("demo", "fsdp", "demo_image"):
        job = summary[name]
        if job:
            print(f"{name}: {job['status']}, {job['layout']}, step {job['step']}/"
                  f"{job['total_steps']}, loss {job['first_loss']} -> {job['loss']}, "
                  f"{job['samples_per_s']} samples/s")
    print("fsdp memory:", json.dumps(summary["fsdp_memory"]))
    print("nvml while running:", json.dumps(summary["fsdp_nvml_while_running"])[:600])
    print(f"summary: {out / 'summary.json'}")
    return 0 if all(r["exit"] in (0, "skipped") for r in summary["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
