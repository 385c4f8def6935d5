"""Warm workers (`run --warm`, launch/warm.py): real torchrun + gloo workers forked from a
forkserver that imported torch, against the same job started plain.

What a user would check: the script runs as under a fresh start (its `__name__`, argv and
sys.path[0], a spawned DataLoader worker that must find the script's own Dataset class) and
ends with the same loss, only without importing torch again (it is in `sys.modules` before the
script imports it); gpufleet still sees each rank (steps counted by the bootstrap, CPU
telemetry per rank with the bootstrap off, the failing rank's exception as the reason, a
restart); a `--preload` module that cannot be imported turns the warm start off with a line
that says why; a bad `--preload` is one line, exit 2.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from fleet_helpers import WORKERS, Fleet, error_lines, wait_no_leftovers
from images import image_or_skip

PROBE = str(WORKERS / "warm_probe.py")
PLAIN = str(WORKERS / "plain_ddp.py")
FAILS_ONCE = str(WORKERS / "fails_once.py")
LINE = re.compile(r"probe rank (\d) warm=(\w+) name=(\S+) argv=(\[.*?\]) path0=(\S+) "
                  r"forkserver_parent=(\w+)")
RUN_TIMEOUT = 300  # a wait on a loaded machine, never a verdict


def _probe(fleet: Fleet, name: str, *flags: str) -> tuple[dict[int, tuple[str, ...]], str]:
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", name, "-y", *flags, PROBE,
                 "--", "6", timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = fleet.ok("logs", name).stdout
    lines = {int(m.group(1)): m.groups()[1:] for m in LINE.finditer(log)}
    final = re.search(r"probe final loss (\S+)", log)
    assert final and set(lines) == {0, 1}, log[-3000:]
    return lines, final.group(1)


def _ranks_sampled(home: Path, job: str) -> set[int]:
    with sqlite3.connect(home / "state.db") as db:
        return {r for (r,) in db.execute("select distinct rank from metrics where job = ? and "
                                          "name = 'gpu_utilization'", (job,))}


def test_warm_workers_run_the_script_as_a_fresh_start_would_with_torch_loaded(
        fleet: Fleet) -> None:
    warm, warm_loss = _probe(fleet, "warm", "--warm")
    plain, plain_loss = _probe(fleet, "plain")
    for rank in (0, 1):
        assert warm[rank][0] == "True" and plain[rank][0] == "False"  # torch there already
        assert warm[rank][4] == "True" and plain[rank][4] == "False"  # forked from the server
        # __name__, argv and sys.path[0] as a fresh `python warm_probe.py 6` has them
        assert warm[rank][1:4] == plain[rank][1:4] == (
            "__main__", f"['{PROBE}', '6']", str(WORKERS))
    assert warm_loss == plain_loss  # the same training, the spawned DataLoader worker included
    s = fleet.status("warm")
    assert (s["status"], s["step"]) == ("succeeded", 6)  # the bootstrap counted every step
    assert not wait_no_leftovers(fleet.home, PROBE)


def test_each_warm_rank_is_sampled_without_any_report_from_it(fleet: Fleet) -> None:
    """With the bootstrap off no rank reports its pid: telemetry finds forked ranks by the
    name each gives its process (their /proc environ is the forkserver's, without RANK)."""
    _probe(fleet, "quiet", "--warm", "--no-bootstrap")
    assert _ranks_sampled(fleet.home, "quiet") == {0, 1}


def test_the_failing_ranks_exception_is_the_reason_under_a_warm_start(fleet: Fleet) -> None:
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "boom", "-y", "--warm", PLAIN,
                 "--", "--max_steps", "20", "--fail-at", "3", "--fail-rank", "1",
                 timeout=RUN_TIMEOUT)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    s = fleet.status("boom")
    assert s["reason"] == "rank 1 failed (exit code 1): RuntimeError: boom at step 3 on rank 1"
    assert [f["title"] for f in s["findings"] if f["rule"] == "worker_error"] == [
        "Rank 1 raised RuntimeError"]
    assert not wait_no_leftovers(fleet.home, PLAIN)


def test_a_warm_job_restarts_after_a_failure(fleet: Fleet) -> None:
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "again", "-y", "--warm",
                 "--max-restarts", "1", FAILS_ONCE, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = fleet.status("again")
    kinds = [e["kind"] for e in s["events"]]
    assert s["status"] == "succeeded" and s["step"] == 5, s
    assert "worker_failed" in kinds and "restarting" in kinds, kinds
    log = fleet.ok("logs", "again").stdout
    assert log.count("fails_once rank 1 done") == 1 and "failing at step 3 as asked" in log


def test_a_preload_that_cannot_be_imported_turns_the_warm_start_off_and_says_why(
        fleet: Fleet) -> None:
    lines, _loss = _probe(fleet, "cold", "--warm", "--preload", "no_such_module_here")
    assert all(v[0] == "False" and v[4] == "False" for v in lines.values()), lines
    log = fleet.ok("logs", "cold").stdout
    assert ("gpufleet: warm start off: --preload no_such_module_here could not be imported: "
            "ModuleNotFoundError") in log, log[-3000:]
    [off] = [e["reason"] for e in fleet.status("cold")["events"] if e["kind"] == "warm_off"]
    assert off.startswith("workers started cold: --preload no_such_module_here could not be "
                          "imported: ModuleNotFoundError"), off


@pytest.mark.parametrize("value", ["not a module", "torch,1x"])
def test_a_bad_preload_is_one_line_with_nothing_started(fleet: Fleet, value: str) -> None:
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "bad", "-y", "--warm",
                 "--preload", value, PROBE)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = error_lines(done.stderr)
    assert "preload" in line and "is not a module name" in line, line
    assert "Traceback" not in done.stderr
    assert fleet.clusters(all_=True) == []


def test_warm_workers_in_an_image_use_the_images_torch(fleet: Fleet) -> None:
    """The launcher runs in the container with the image's Python: its forkserver imports the
    image's torch, and the ranks run the script as a fresh start would there."""
    image = image_or_skip()
    lines, loss = _probe(fleet, "inimage", "--warm", "--image", image)
    assert all(v[0] == "True" and v[4] == "True" for v in lines.values()), lines
    _plain, plain_loss = _probe(fleet, "bare")  # the same wheel of torch on this host
    assert loss == plain_loss
