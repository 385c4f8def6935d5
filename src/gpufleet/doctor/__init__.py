"""`gpufleet doctor`: validate a node (or a cluster's nodes) before running a job on it.

    checks.py     pure: facts dataclasses in, `Check(name, status, detail, fix)` out; no torch
    facts.py      gathers the facts (NVML, torch, environment, limits, disk); side effects here
    allreduce.py  the all-reduce worker run under torchrun, and `run()`, which launches it
    command.py    `doctor(cluster, as_json, console) -> exit code`, tables and JSON

docs/doctor.md describes every check, its thresholds and its fix.
"""
