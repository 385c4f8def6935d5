"""Reading telemetry for the rules: the window's samples, means and shares, and the words
and numbers the findings are written in."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from gpufleet.telemetry.findings import Inputs, Points, Series, Thresholds

_QUOTE_CHARS = 200  # a quoted log line is cut here: a stack of C++ frames on one line is unreadable


# --- reading the series ----------------------------------------------------------------------

def in_window(points: Iterable[tuple[float, float]], inp: Inputs, th: Thresholds) -> Points:
    """The finite samples in the window; a NaN step time is a broken report, not a slow step."""
    since = inp.now - th.window_s
    return [(t, v) for t, v in points if t >= since and math.isfinite(v)]


def enough(series: Series, name: str, inp: Inputs, th: Thresholds) -> dict[int, Points]:
    """Per key, the window's samples, leaving out keys with too few to judge."""
    out = {}
    for key, points in sorted(series.get(name, {}).items()):
        recent = in_window(points, inp, th)
        if len(recent) >= th.min_points:
            out[key] = recent
    return out


def means(series: Series, name: str, inp: Inputs, th: Thresholds) -> dict[int, float]:
    return {k: statistics.fmean(v for _, v in pts) for k, pts in enough(series, name, inp, th).items()}


def step_shares(inp: Inputs, th: Thresholds, part: str) -> dict[int, float]:
    """Per rank, mean `part` seconds over mean step seconds in the window.

    A ratio of means, not a mean of ratios: the two series need not have the same samples, and a
    few very short steps do not outvote the long ones.
    """
    steps = means(inp.ranks, "step_time_seconds", inp, th)
    parts = means(inp.ranks, part, inp, th)
    return {r: parts[r] / steps[r] for r in sorted(steps.keys() & parts.keys()) if steps[r] > 0}


# --- words and numbers -----------------------------------------------------------------------

def pct(x: float) -> str:
    return f"{x:.0%}"


def dur(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min"


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def quote(line: str) -> str:
    text = line.strip()
    return f'"{text}"' if len(text) <= _QUOTE_CHARS else f'"{text[:_QUOTE_CHARS - 3]}..."'


def running(inp: Inputs) -> bool:
    """Telemetry of a job that is not running is stale or absent: only its log can be judged."""
    return inp.status == "running"

