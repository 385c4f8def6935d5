"""Diagnosis: pure rules over a job's recent telemetry that name a problem and the fix to try.

The supervisor calls `diagnose` every few seconds with what it has in memory (recent samples
per rank and per device, the tail of the workers' output, the job's progress) and stores the
findings; the dashboard, `status` and `/metrics` only read them. Every rule is a function of
`Inputs` and `Thresholds` (telemetry/findings.py), so each can be tested on synthetic series;
the rules live in rules_speed.py, rules_faults.py and rules_elastic.py.
"""

from __future__ import annotations

from dataclasses import replace

from gpufleet.telemetry.findings import Finding, Inputs, Rule, Series, Severity, Thresholds
from gpufleet.telemetry.rules_elastic import resizes
from gpufleet.telemetry.rules_faults import comm_timeout, memory, precision, worker_error
from gpufleet.telemetry.rules_speed import data_loading, no_steps, scaling, stalled, straggler

__all__ = ["Finding", "Inputs", "Series", "Severity", "Thresholds", "diagnose"]

RULES: tuple[Rule, ...] = (data_loading, memory, scaling, comm_timeout, worker_error, straggler,
                           stalled, precision, no_steps, resizes)

_ORDER: dict[Severity, int] = {"critical": 0, "warning": 1, "info": 2}


def diagnose(inp: Inputs, th: Thresholds = Thresholds()) -> list[Finding]:
    """Every finding the rules make, most severe first.

    Conditions of one rule about one subject (fp16 overflow and a NaN loss, say) are merged into
    one finding, so that `Finding.key` names at most one finding per round.
    """
    found = [f for rule in RULES for f in rule(inp, th)]
    return sorted(_merge(found), key=lambda f: _ORDER[f.severity])


def _merge(found: list[Finding]) -> list[Finding]:
    groups: dict[str, list[Finding]] = {}
    for f in found:
        groups.setdefault(f.key, []).append(f)
    merged = []
    for group in groups.values():
        group = sorted(group, key=lambda f: _ORDER[f.severity])
        fixes = dict.fromkeys(f.fix for f in group)
        merged.append(replace(group[0], detail=" ".join(f.detail for f in group), fix=" ".join(fixes)))
    return merged

