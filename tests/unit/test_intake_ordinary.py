"""The intake's side of scripts that never call gpufleet: the bootstrap's notes and reports,
a loss read from the log, a total read from the script's arguments."""

from __future__ import annotations

import json
import math
from typing import Any

from gpufleet.reportauth import Signer, new_key
from gpufleet.store import Cluster, Job
from gpufleet.supervise.events import RecordEvent
from gpufleet.supervise.intake import Intake

KEY = new_key()
SPEC = json.dumps({"strategy": "fsdp", "framework": "torchrun", "precision": "fp32"})


def intake(total_steps: int | None = None) -> Intake:
    i = Intake(Job(name="j", total_steps=total_steps, spec_json=SPEC, world_size=2, samples=0),
               Cluster(name="c"), KEY)
    i.requested_layout = "fsdp, dp=2 x tp=1 x pp=1, fp32, torchrun"
    return i


def send(i: Intake, rec: dict[str, Any]) -> list[Any]:
    return i.datagram(Signer(KEY).seal(json.dumps(rec).encode()), lambda pid: False)


def test_the_bootstrap_note_makes_the_job_one_that_reports() -> None:
    i = intake()
    assert not i.reports_expected
    send(i, {"t": 1.0, "rank": 0, "event": "bootstrap", "pid": 7})
    assert i.reports_expected


def test_the_layout_note_is_recorded_once_with_its_event() -> None:
    i = intake()
    first = send(i, {"t": 1.0, "rank": 0, "event": "layout", "applied": False, "own": "ddp",
                     "world": 2})
    again = send(i, {"t": 1.0, "rank": 1, "event": "layout", "applied": False, "own": "ddp",
                     "world": 2})
    assert i.job.layout_seen == "own:ddp"
    events = [e for e in first if isinstance(e, RecordEvent)]
    assert len(events) == 1 and "not applied" in events[0].text
    assert not any(isinstance(e, RecordEvent) for e in again)


def test_a_total_from_the_arguments_grows_to_the_steps_that_ran() -> None:
    i = intake(total_steps=30)
    for step in (30, 31):
        send(i, {"t": float(step), "rank": 0, "step": step, "src": "bootstrap"})
    assert (i.job.step, i.job.total_steps) == (31, 31)


def test_steps_without_samples_have_no_samples_per_second() -> None:
    i = intake()
    for step in (1, 2, 3):
        send(i, {"t": float(step), "rank": 0, "step": step, "src": "bootstrap"})
    assert i.job.samples_per_s is None and i.job.step == 3


def test_a_logged_loss_counts_until_a_report_carries_one() -> None:
    i = intake()
    i.log_loss(1.0, 2.5)
    i.log_loss(2.0, 2.0)
    assert (i.job.first_loss, i.job.loss) == (2.5, 2.0)
    assert [m.value for m in i.pending if m.name == "loss"] == [2.5, 2.0]
    i.log_loss(3.0, math.nan)  # kept for the precision rule, not stored (SQL has no NaN)
    assert len([m for m in i.pending if m.name == "loss"]) == 2
    send(i, {"t": 4.0, "rank": 0, "step": 4, "loss": 1.0})
    i.log_loss(5.0, 9.0)
    assert i.job.loss == 1.0


def test_bootstrap_counts_are_only_signs_of_life_once_the_sdk_reports() -> None:
    i = intake()
    send(i, {"t": 1.0, "rank": 0, "step": 1, "loss": 3.0})  # the SDK on rank 0
    out = send(i, {"t": 2.0, "rank": 1, "step": 40, "src": "bootstrap"})
    assert [type(e).__name__ for e in out] == ["WorkerNote"]
    assert i.job.step == 1
