"""What `jobs` and a waiting `run` say about a queued job's start: its place and estimate, or
the true reason there is none (held, after a job, what holds the devices has no end), never a
bare "?"."""

from __future__ import annotations

from typing import Any

from gpufleet.cli.follow import queue_line
from gpufleet.cli.queue import start_text

NOW = 1_000_000.0


def row(**fields: Any) -> dict[str, Any]:
    return {"status": "queued", "position": 2, "est_start": None, "start_note": None,
            "wait": "devices", "reason": "waits for 1 CPU slot to be free (0 free now)",
            "held_by": None, "started_at": None, **fields}


def test_the_start_column_says_the_estimate_or_why_there_is_none() -> None:
    assert start_text(row(est_start=NOW + 240), NOW) == "#2 ~4m"
    note = "unknown (a running job has no --time-limit)"
    assert start_text(row(start_note=note), NOW) == f"#2 {note}"
    assert start_text(row(wait="held", start_note="held"), NOW) == "#2 held"
    assert start_text(row(wait="after", start_note="after prep"), NOW) == "#2 after prep"
    assert start_text(row(position=None), NOW) == "-"  # not planned yet: the next pass says
    assert start_text(row(status="running", started_at=NOW - 120), NOW) == "2m ago"


def test_a_waiting_run_says_the_same() -> None:
    note = "unknown (a launched cluster holds the devices until it is stopped)"
    assert queue_line(row(start_note=note), NOW) == (
        f"queued: position 2, estimated start {note}; waits for 1 CPU slot to be free (0 free now)")
    assert queue_line(row(est_start=NOW + 30), NOW).startswith(
        "queued: position 2, estimated start in about 30s; ")
    held = row(wait="held", reason="held: it keeps its place but starts only after gpufleet "
               "release j")
    assert queue_line(held, NOW) == f"queued: position 2; {held['reason']}"
