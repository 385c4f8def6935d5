"""The failing rank's exception is the reason, every time (issue 18): real torchrun + gloo
workers running an ordinary script that knows nothing of gpufleet (workers/plain_ddp.py).

Its rank 1 prints many `Overriding: ...` lines (as nanoGPT does) and then raises; with `--tee`
those lines come after the traceback, and rank 0 sees its peer's connection close. The reason
must quote rank 1's RuntimeError from its error record (written by the worker bootstrap), never
the noise and never rank 0, and no communication finding may be raised for rank 0's closed
connection. $GPUFLEET_ERROR_RUNS sets how many times the failing case runs (3 by default; the
issue's check is 20).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from fleet_helpers import WORKERS, Fleet, wait_no_leftovers

PLAIN = str(WORKERS / "plain_ddp.py")
RUNS = int(os.environ.get("GPUFLEET_ERROR_RUNS", "3"))
NOISE = 50  # more than a rank's log tail holds (logs.TAIL_LINES)
FAILING = ("--max_steps", "20", "--fail-at", "3", "--fail-rank", "1", "--noise-lines", str(NOISE))
BOOM = re.compile(r"RuntimeError: boom at step 3 on rank 1")


def _fail(fleet: Fleet, name: str, *extra: str, env: dict[str, str] | None = None
          ) -> dict[str, Any]:
    r = fleet("run", "--gpu", "cpu", "--count", "2", "--name", name, "-y", *extra, PLAIN, "--",
              *FAILING, timeout=180, env=env)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    return fleet.status(name)


def _error_files(fleet: Fleet, name: str) -> list[Path]:
    return sorted((fleet.home / "jobs" / name / "torchrun").glob("*/attempt_*/*/error.json"))


def _log_end(fleet: Fleet, name: str) -> str:
    """The job log's last lines, launcher's own (no rank prefix), for a failure's message."""
    lines = (fleet.home / "jobs" / name / "job.log").read_text().splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith("[rank"))[-3000:]


def test_the_failing_ranks_exception_is_the_reason_every_time(fleet: Fleet) -> None:
    started = time.monotonic()
    for i in range(RUNS):
        name = f"boom{i}"
        s = _fail(fleet, name)
        reason = s["reason"]
        assert s["status"] == "failed", s
        assert reason == "rank 1 failed (exit code 1): RuntimeError: boom at step 3 on rank 1", \
            f"run {i + 1} of {RUNS}: {reason!r}"
        [failed] = [e["reason"] for e in s["events"] if e["kind"] == "worker_failed"]
        assert BOOM.search(failed) and "Overriding" not in failed and "rank 0" not in failed
        assert "comm_timeout" not in {f["rule"] for f in s["findings"]}, s["findings"]
        assert [f["title"] for f in s["findings"] if f["rule"] == "worker_error"] == [
            "Rank 1 raised RuntimeError"], (s["findings"], _log_end(fleet, name))
        # the records are torchrun's own files: rank 1's exception, and rank 0's knock-on
        assert any("boom at step 3" in p.read_text() for p in _error_files(fleet, name))
    print(f"\n{RUNS} of {RUNS} runs named rank 1's RuntimeError in "
          f"{time.monotonic() - started:.0f}s")
    assert not wait_no_leftovers(fleet.home, PLAIN)


def test_a_restart_says_gpufleet_holds_no_checkpoint(fleet: Fleet) -> None:
    s = _fail(fleet, "again", "--max-restarts", "1")
    restarting = [e["reason"] for e in s["events"] if e["kind"] == "restarting"]
    assert restarting == [
        "rank 1 failed (exit code 1): RuntimeError: boom at step 3 on rank 1; restart 1 of 1 now, "
        "gpufleet holds no checkpoint: the script restarts as written (it may resume from its own "
        "checkpoints)"], s["events"]
    assert not any("from the start" in e["reason"] for e in s["events"])
    # the second run's failure is read from the second run's record
    failed = [e["reason"] for e in s["events"] if e["kind"] == "worker_failed"]
    assert len(failed) == 2 and all(BOOM.search(f) and "Overriding" not in f for f in failed)
    assert s["reason"].startswith("rank 1 failed (exit code 1): RuntimeError: boom at step 3 on "
                                  "rank 1; gave up after 1 restart(s)"), s["reason"]


def test_with_the_bootstrap_off_the_logs_still_name_the_exception(fleet: Fleet) -> None:
    s = _fail(fleet, "off", env={"GPUFLEET_BOOTSTRAP": "0"})
    assert _error_files(fleet, "off") == []  # no record: the reason comes from the log tails
    # rank 1 raised; whether it exited by itself (1) or torchrun's SIGTERM reached it while its
    # interpreter was still ending, after rank 0 had left on the closed connection (-15), is a
    # race between the two ranks, and the reason says whichever happened
    assert re.match(r"rank 1 failed: RuntimeError: boom at step 3 on rank 1 \(exit code (1|-15)\); "
                    r"last lines:", s["reason"]), s["reason"]
    assert "comm_timeout" not in {f["rule"] for f in s["findings"]}, s["findings"]
