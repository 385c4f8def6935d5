"""The adversarial trial against a real job: another process on the machine sends datagrams to
the job's report port. Before reports were signed, one bare `exit_for_resize` made this
non-elastic job train a second time, a fake checkpoint at step 1e9 was recorded and fake progress
moved its step. Now the job runs once, none of that is recorded, the drops are told in one event,
and the job's key appears in no file, log or status of the job."""

from __future__ import annotations

import json
import socket
import time

from fleet_helpers import WORKERS, Fleet, leftovers

SLEEPER = str(WORKERS / "sleeper.py")
STEPS = 15  # 0.2 s each


def _key_of_a_worker(fleet: Fleet) -> str | None:
    """The key in a running worker's environment (the job has reported: its worker is up)."""
    for p in leftovers(fleet.home, "sleeper.py"):
        key = p.environ().get("GPUFLEET_REPORT_KEY")
        if key:
            return key
    return None


def test_forged_reports_are_dropped_and_the_job_runs_once(fleet: Fleet) -> None:
    fleet.ok("run", "-d", "--gpu", "cpu", "--count", "1", "--name", "target", "-y", SLEEPER,
             "--", str(STEPS), timeout=60)
    fleet.wait_for_step("target", 1)
    key = _key_of_a_worker(fleet)
    job_dir = fleet.home / "jobs" / "target"
    host, _, port = json.loads((job_dir / "command.json").read_text())["env"][
        "GPUFLEET_REPORT_ADDR"].rpartition(":")
    forged = [{"rank": 0, "event": "exit_for_resize", "step": 2},
              {"rank": 0, "event": "checkpoint", "step": 10**9, "bytes": 1, "path": "/x"},
              *({"t": time.time(), "rank": 0, "step": 10**9, "pid": 1, "loss": 0.0}
                for _ in range(40))]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for rec in forged:
            sock.sendto(json.dumps(rec).encode(), (host, int(port)))
        # a header of the right shape with a made-up tag is no better
        sock.sendto(b"GF1 0011223344556677 1 " + b"0" * 64 + b"\n"
                    + json.dumps({"rank": 0, "event": "exit_for_resize"}).encode(),
                    (host, int(port)))

    deadline = time.monotonic() + 90
    while (seen := fleet.peek("target")) is None or seen["status"] in ("starting", "running"):
        assert time.monotonic() < deadline, seen
        assert seen is None or (seen["step"] or 0) <= STEPS, "forged progress reached the job"
        time.sleep(0.3)
    s = fleet.wait_ended("target")
    assert s["status"] == "succeeded", s
    assert s["step"] == STEPS
    kinds = [e["kind"] for e in s["events"]]
    assert kinds.count("running") == 1 and "resized" not in kinds, kinds  # it ran once
    assert "checkpoint" not in kinds
    told = [e["reason"] for e in s["events"] if e["kind"] == "reports_rejected"]
    assert 1 <= len(told) <= 2, told  # one event (maybe a final count), not one per datagram
    n = len(forged) + 1
    assert f"({n} so far: {len(forged)} unsigned, 1 with a bad signature)" in told[-1], told

    assert key is not None and len(key) == 64
    assert key not in json.dumps(s)
    for path in [*job_dir.rglob("*"), *fleet.home.glob("*")]:
        if path.is_file():
            assert key.encode() not in path.read_bytes(), f"the report key is in {path}"
