"""The rule about an elastic job's resizes: each one judged by goodput says what it did and why,
so a resized job's diagnosis tells the story (and a revert says what to change) rather than
finding nothing."""

from __future__ import annotations

from gpufleet.telemetry.findings import Finding, Inputs, ResizeVerdict, Thresholds

_KNOBS = ("--scale-tolerance sets how much of the samples per $ a resize may cost (default "
          "10%).")


def resizes(inp: Inputs, _th: Thresholds) -> list[Finding]:
    """One finding per judged resize, for as long as the job lives (ended too): what happened
    stays true."""
    return [_finding(i, r) for i, r in enumerate(inp.resizes, start=1)]


def _finding(i: int, r: ResizeVerdict) -> Finding:
    size = f"{r.before} -> {r.after} workers"
    subject = f"resize {i} ({r.before} -> {r.after})"
    if not r.reverted:
        return Finding(rule="elastic", severity="info", subject=subject,
                       title=f"Resized {size}, kept on goodput", detail=_sentence(r),
                       fix=f"Nothing to fix. {_KNOBS}")
    if r.after < r.before:
        return Finding(
            rule="elastic", severity="warning", subject=subject,
            title=f"Shrinking {size} lowered goodput; reverted",
            detail=_sentence(r) + " Low utilization did not mean too many workers here: on "
            "a shared host it is often contention for the cores, and fewer workers only train "
            "slower.",
            fix="Nothing is needed: shrinking is held off, then tried again. To stop the tries, "
                "lower --scale-down-util or run at a fixed size (no --workers). " + _KNOBS)
    return Finding(
        rule="elastic", severity="warning", subject=subject,
        title=f"Growing {size} did not pay for itself; reverted",
        detail=_sentence(r) + " The extra workers raised the throughput by less than they "
        "cost.",
        fix="Nothing is needed: growing is held off, then tried again. To buy speed at a higher "
            "cost per sample, raise --scale-tolerance; to stop the tries, lower the maximum of "
            "--workers.")


def _sentence(r: ResizeVerdict) -> str:
    said = r.text[:1].upper() + r.text[1:] + "."
    return f"{said} It was tried on {r.trigger}." if r.trigger else said
