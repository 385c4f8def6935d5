"""A job's runs, restarts and chart markers from its events (`supervise.timeline`): one run per
start of the workers (a restart, a resize, a `run --resume`), not per `running` event."""

from __future__ import annotations

from gpufleet.supervise import timeline
from gpufleet.supervise.timeline import Cause

# (time, kind, reason), as jobs.events gives them: a failure restarted, a resize done, a
# resize abandoned (the same workers go on), the job stopped, then resumed
EVENTS = [
    (10.0, "starting", "job created"),
    (11.0, "running", "2 worker(s) on dev"),
    (20.0, "worker_failed", "rank 1 failed"),
    (20.5, "restarting", "rank 1 failed; restart 1 of 2 now"),
    (22.0, "running", "2 worker(s) on dev (run 2)"),
    (30.0, "resizing", "2 -> 4 workers: busy"),
    (33.0, "resized", "2 -> 4 workers from the checkpoint at step 40"),
    (34.0, "running", "4 worker(s) on dev (run 3)"),
    (40.0, "resizing", "4 -> 2 workers: idle"),
    (52.0, "scale_blocked", "resize to 2 abandoned: the workers did not save within 10 s"),
    (52.0, "running", "resize abandoned"),
    (60.0, "stopped", "stop requested"),
    (70.0, "starting", "resumed"),
    (71.0, "running", "4 worker(s) on dev"),
]


def test_each_start_of_the_workers_is_a_run_and_an_abandoned_resize_is_not() -> None:
    runs = timeline.runs(EVENTS)
    assert [(r.number, r.start, r.cause) for r in runs] == [
        (1, 11.0, Cause.START), (2, 22.0, Cause.RESTART), (3, 34.0, Cause.RESIZE),
        (4, 71.0, Cause.RESUME)]


def test_the_current_run_began_at_its_running_event_not_an_abandoned_resizes() -> None:
    assert timeline.current_start(EVENTS[:-3]) == 34.0  # before the stop: run 3's start
    assert timeline.current_start(EVENTS) == 71.0
    assert timeline.current_start(EVENTS[:1]) is None


def test_a_failure_during_a_resize_restarts_as_a_new_run() -> None:
    events = [(1.0, "running", ""), (5.0, "resizing", "2 -> 4"), (6.0, "hang", "no report"),
              (6.5, "restarting", "restart 1"), (8.0, "running", "(run 2)")]
    assert [r.cause for r in timeline.runs(events)] == [Cause.START, Cause.RESTART]


def test_markers_are_the_listed_kinds_and_each_resume() -> None:
    marks = timeline.markers(EVENTS)
    assert [(m.time, m.kind, m.label) for m in marks] == [
        (20.5, "restarting", "restart"), (33.0, "resized", "resized"),
        (52.0, "scale_blocked", "resize blocked"), (71.0, "resume", "resume")]
    assert marks[0].text == "rank 1 failed; restart 1 of 2 now"


def test_a_new_kind_is_one_entry_in_the_list() -> None:
    events = [(1.0, "running", ""), (5.0, "spot_notice", "preempted in 2 min")]
    assert timeline.markers(events) == []
    kinds = {**timeline.MARKER_KINDS, "spot_notice": "spot notice"}
    assert [m.label for m in timeline.markers(events, kinds)] == ["spot notice"]


def test_an_elastic_verdict_is_marked() -> None:
    events = [(1.0, "running", ""), (5.0, "resize_reverted", "throughput fell 82% ...")]
    assert [m.label for m in timeline.markers(events)] == ["resize reverted"]


def test_restarts_count_the_failures_retried() -> None:
    assert timeline.restarts(EVENTS) == 1
    assert timeline.restarts([(1.0, "running", ""), (2.0, "succeeded", "")]) == 0


def test_of_rows_places_each_marker_at_rank_0s_step_by_then() -> None:
    rows = [{"time": t, "kind": k, "reason": r} for t, k, r in EVENTS]
    steps = {20.5: 37.0, 33.0: 40.0, 52.0: 61.0}  # what the store's step samples would say
    got = timeline.of_rows(rows, lambda t: steps.get(t))
    assert got["restarts"] == 1
    assert [r["cause"] for r in got["runs"]] == ["start", "restart", "resize", "resume"]
    assert [(m["kind"], m["step"]) for m in got["markers"]] == [
        ("restarting", 37.0), ("resized", 40.0), ("scale_blocked", 61.0), ("resume", None)]
    assert timeline.of_rows([], lambda t: None) == {"runs": [], "markers": [], "restarts": 0}
