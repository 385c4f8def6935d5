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

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from fleet_helpers import WORKERS, Fleet, error_lines, wait_no_leftovers
from images import image_or_skip

from gpufleet.launch import warm_restart
from gpufleet.supervise.blame import summary

PROBE = str(WORKERS / "warm_probe.py")
PLAIN = str(WORKERS / "plain_ddp.py")
FAILS_ONCE = str(WORKERS / "fails_once.py")
LINE = re.compile(r"probe rank (\d) warm=(\w+) name=(\S+) argv=(\[.*?\]) path0=(\S+) "
                  r"forkserver_parent=(\w+) frozen=(\d+)")
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
    db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        return {r for (r,) in db.execute("select distinct rank from metrics where job = ? and "
                                          "name = 'gpu_utilization'", (job,))}
    finally:
        db.close()


def test_warm_workers_run_the_script_as_a_fresh_start_would_with_torch_loaded(
        fleet: Fleet) -> None:
    warm, warm_loss = _probe(fleet, "warm", "--warm")
    plain, plain_loss = _probe(fleet, "plain", "--no-warm")
    for rank in (0, 1):
        assert warm[rank][0] == "True" and plain[rank][0] == "False"  # torch there already
        assert warm[rank][4] == "True" and plain[rank][4] == "False"  # forked from the server
        # what torch's import made, moved out of the rank's collections (launch/warm_freeze.py)
        assert int(warm[rank][5]) > 50_000 and plain[rank][5] == "0", (warm, plain)
        # __name__, argv and sys.path[0] as a fresh `python warm_probe.py 6` has them
        assert warm[rank][1:4] == plain[rank][1:4] == (
            "__main__", f"['{PROBE}', '6']", str(WORKERS))
    assert warm_loss == plain_loss  # the same training, the spawned DataLoader worker included
    s = fleet.status("warm")
    assert (s["status"], s["step"]) == ("succeeded", 6)  # the bootstrap counted every step
    assert not wait_no_leftovers(fleet.home, PROBE)


def test_each_warm_rank_is_sampled_without_any_report_from_it(fleet: Fleet,
                                                              tmp_path: Path) -> None:
    """With the bootstrap off no rank reports its pid: telemetry finds forked ranks by the
    name each gives its process (their /proc environ is the forkserver's, without RANK). The
    ranks hold after their steps until both were sampled (a short job can end between two
    samples, a second apart)."""
    release = tmp_path / "release"
    fleet.ok("run", "--gpu", "cpu", "--count", "2", "--name", "quiet", "-y", "-d", "--warm",
             "--no-bootstrap", PROBE, "--", "6", str(release), timeout=RUN_TIMEOUT)
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline and _ranks_sampled(fleet.home, "quiet") != {0, 1}:
        time.sleep(0.2)
    sampled = _ranks_sampled(fleet.home, "quiet")
    release.touch()
    assert sampled == {0, 1}
    assert fleet.wait_ended("quiet", timeout=RUN_TIMEOUT)["status"] == "succeeded"


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
    _plain, plain_loss = _probe(fleet, "bare", "--no-warm")  # the same wheel of torch on this host
    assert loss == plain_loss


@pytest.mark.parametrize("where", ["at-end", "in-main"])
def test_a_rank_whose_gloo_group_is_freed_while_a_collective_waits_for_the_gil_ends(
        fleet: Fleet, tmp_path: Path, where: str) -> None:
    """A warm rank frees no gloo group before it ends, so the gloo thread that waits for the
    GIL to free the last collective never meets the group's destructor waiting for it (a hang
    on a loaded machine, forced here): not what the script left at its end (`at-end`), nor the
    group of a model freed when the script's `main()` returns after `destroy_process_group()`
    (`in-main`, the PyTorch DDP tutorial's pattern: it hung 3 runs of 3 before the launcher kept
    the groups a script leaves). The files the script left open are written out as at a fresh
    interpreter's end."""
    left = tmp_path / "left-open"
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "gil", "-y", "--warm",
                 str(WORKERS / "gil_held_at_exit.py"), "--", str(left), where,
                 timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert fleet.status("gil")["status"] == "succeeded"
    for rank in (0, 1):
        assert Path(f"{left}.{rank}").read_text() == "still buffered at the end\n"


# ------------------------------------------------------- restarts inside the running launcher

RESTART = str(WORKERS / "restart_probe.py")
RUN_LINE = re.compile(r"probe run (\d) rank (\d) restart_count (\d+) pid (\d+) ppid (\d+)")


def _restarted(fleet: Fleet, name: str, *flags: str) -> tuple[dict[str, Any], str]:
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", name, "-y", "--max-restarts",
                 "3", *flags, RESTART, "--", "--fail-runs", "3", timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return fleet.status(name), fleet.ok("logs", name).stdout


def test_a_warm_job_restarts_inside_its_running_launcher_as_a_plain_one_restarts(
        fleet: Fleet) -> None:
    """Three failures, three restarts decided by the supervisor: under --warm each is handed
    to the launcher that waits with its workers ended (every run's ranks are children of one
    forkserver), with the run's number in the ranks' environment and torch's restart count
    counting; the job's events and its final loss are those of the same job started plain."""
    warm, warm_log = _restarted(fleet, "inplace", "--warm")
    plain, plain_log = _restarted(fleet, "fresh", "--no-warm")
    runs = {(int(r), int(k)): (int(c), int(pp)) for r, k, c, _pid, pp in
            RUN_LINE.findall(warm_log)}
    assert set(runs) == {(r, k) for r in (1, 2, 3, 4) for k in (0, 1)}, warm_log[-3000:]
    assert {pp for _c, pp in runs.values()} == {runs[(1, 0)][1]}  # one forkserver, one launcher
    assert [runs[(r, 0)][0] for r in (1, 2, 3, 4)] == [0, 1, 2, 3]
    assert warm_log.count("the workers restart inside the running launcher") == 3
    plain_parents = {pp for *_x, pp in RUN_LINE.findall(plain_log)}
    assert len(plain_parents) == 4  # plain: a new torchrun per run (ranks are its children)

    def story(s: dict[str, Any]) -> list[tuple[str, str]]:
        """The events, each job's cluster name aside; without diagnoses, which come from
        periodic scans of the logs and metrics (when one runs is the clock's business)."""
        return [(e["kind"], re.sub(r"run-[0-9a-f]+", "CLUSTER", e["reason"].split("\n")[0]))
                for e in s["events"] if e["kind"] != "diagnosis"]

    assert story(warm) == story(plain), (story(warm), story(plain))
    assert [e["reason"].split("\n")[0] for e in warm["events"] if e["kind"] == "worker_failed"] \
        == [f"rank 1 failed (exit code 1): RuntimeError: planned failure {r} at step 3"
            for r in (1, 2, 3)]
    final = re.findall(r"probe final loss (\S+)", warm_log)
    assert final and final == re.findall(r"probe final loss (\S+)", plain_log)
    assert warm["status"] == plain["status"] == "succeeded"
    assert not wait_no_leftovers(fleet.home, RESTART)


def test_an_sdk_job_restarted_three_times_ends_as_the_same_job_started_plain(
        fleet: Fleet, tmp_path: Path) -> None:
    """The SDK's side of the check above (train.prepare, a Checkpointer that keeps the loader's
    and the scheduler's state): rank 1 fails in each of the first three runs, each time after
    that run's newest checkpoint, so each run resumes further on. Restarted inside the running
    launcher (warm) and by a new torchrun per run (plain), the job records the same loss at
    every step, redoes the same steps with the same losses, and ends with the same weights."""
    import torch

    got: dict[str, tuple[list[tuple[int, float]], dict[str, Any]]] = {}
    for name, flag in (("sdkwarm", "--warm"), ("sdkplain", "--no-warm")):
        losses, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.pt"
        done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", name, "-y",
                     "--max-restarts", "3", flag, str(WORKERS / "survive.py"), "--", "--steps",
                     "24", "--every", "5", "--die-at", "7", "--fail-runs", "3", "--losses",
                     str(losses), "--out", str(out), timeout=RUN_TIMEOUT)
        log = fleet.ok("logs", name).stdout
        assert done.returncode == 0, log[-3000:]
        failed = [e["reason"].split("\n")[0] for e in fleet.status(name)["events"]
                  if e["kind"] == "worker_failed"]
        assert failed == [f"rank 1 failed (exit code 1): RuntimeError: planned failure {r} at "
                          f"step {7 + 5 * (r - 1)}" for r in (1, 2, 3)], failed
        assert log.count("the workers restart inside the running launcher") == \
            (3 if flag == "--warm" else 0), log[-3000:]
        rows = [json.loads(ln) for ln in losses.read_text().splitlines()]
        got[flag] = ([(r["step"], r["loss"]) for r in rows], torch.load(out))
    warm, plain = got["--warm"], got["--no-warm"]
    by_step: dict[int, float] = {}
    for step, loss in warm[0]:  # a step redone after a restart gives the loss it gave before
        assert by_step.setdefault(step, loss) == loss, (step, warm[0])
    assert sorted(by_step) == list(range(1, 25))
    assert dict(plain[0]) == by_step
    assert warm[1].keys() == plain[1].keys()
    assert all(torch.equal(warm[1][k], plain[1][k]) for k in warm[1])


def test_a_warm_job_that_runs_out_of_restarts_ends_its_waiting_launcher(fleet: Fleet) -> None:
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "spent", "-y", "--warm",
                 "--max-restarts", "1", RESTART, "--", "--fail-always", timeout=RUN_TIMEOUT)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    s = fleet.status("spent")
    assert s["status"] == "failed"
    assert s["reason"].startswith("rank 1 failed (exit code 1): RuntimeError: planned failure 2 "
                                  "at step 3; gave up after 1 restart(s)"), s["reason"]
    assert fleet.ok("logs", "spent").stdout.count("restart inside the running launcher") == 1
    assert not wait_no_leftovers(fleet.home, RESTART)


def test_a_killed_supervisor_leaves_no_waiting_launcher_behind(fleet: Fleet) -> None:
    """kill -9 of the supervisor while the launcher waits for it (in the 2 s backoff before a
    third restart): the keeper ends the launcher and its forkserver as it ends a running one."""
    fleet.ok("run", "--gpu", "cpu", "--count", "2", "--name", "orphan", "-y", "-d", "--warm",
             "--max-restarts", "5", RESTART, "--", "--fail-always", timeout=RUN_TIMEOUT)
    agent_log = fleet.home / "jobs" / "orphan" / "logs" / "agent.log"
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline and (
            not agent_log.exists() or agent_log.read_text().count(warm_restart.PARKED) < 3):
        time.sleep(0.05)
    text = agent_log.read_text()
    assert text.count(warm_restart.PARKED) == 3, text[-3000:]
    with sqlite3.connect(f"file:{fleet.home / 'state.db'}?mode=ro", uri=True) as db:
        (pid,), = db.execute("select supervisor_pid from jobs where name = 'orphan'").fetchall()
    psutil.Process(pid).kill()  # within the 2 s backoff, unless this machine stalled that long
    assert not wait_no_leftovers(fleet.home, timeout=30)


def test_a_warm_rank_that_ends_with_os_exit_zero_ends_the_job(fleet: Fleet) -> None:
    """torch's agent counts a forked worker done when its return value arrives; one ended by
    os._exit(0) sends none, and the warm launcher had waited for it forever."""
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "hard", "-y", "--warm",
                 str(WORKERS / "exits_hard.py"), timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert fleet.status("hard")["status"] == "succeeded"
    assert fleet.ok("logs", "hard").stdout.count("exits_hard rank") == 2


def test_every_rank_that_failed_before_the_agent_looked_is_in_the_summary() -> None:
    """torch's function-worker path listed only the first failed rank its poll found: a rank
    killed with SIGKILL whose peer failed in the same poll was missing, and the job was blamed
    on the peer's knock-on (5 runs in 10 of a kill -9 at step 5 next to two CPU burners). A
    5 s agent poll puts both ends inside one poll here; torchrun's subprocess path lists both."""
    proc = subprocess.run([sys.executable, "-m", "gpufleet.launch.warm", "--", "--standalone",
                           "--nproc-per-node", "2", "--monitor-interval", "5",
                           str(WORKERS / "killed_peer.py")], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    found = summary(proc.stderr.splitlines())
    # a poll between the two ends (a window of moments in 5 s) would list rank 1 alone
    assert found.codes.get(1) == -9, proc.stderr[-3000:]
    assert found.codes.get(0, 3) == 3, proc.stderr[-3000:]


def test_a_second_stop_signal_does_not_cut_the_workers_end_short(tmp_path: Path) -> None:
    """A stop sends the launcher more than one SIGTERM (gpufleet's to every process below the
    keeper, and in an image podman's proxy of it). torch raised on each: the second one ended
    the launcher in the middle of its shutdown, before its workers had ended and before what
    they printed on the way out was copied to its output (a job's log lost the worker's
    'SIGTERM, ending' line in CI). Three signals here; the workers take 3 s to end on SIGTERM,
    and their line after those 3 s is in the launcher's output: it waited for them. They end
    by themselves (exit 0), not by torch's SIGKILL 30 s after the SIGTERM: a function worker
    that exits 0 used to wait for the agent's word that it had read its result, which an
    agent ending the group never gave."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.launch.warm", "--", "--standalone", "--nproc-per-node",
         "2", "--log-dir", str(tmp_path / "logs"), "--tee", "3",
         str(WORKERS / "napper.py"), "--slow-term", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout is not None
    lines: list[str] = []
    tree: list[psutil.Process] = []
    try:
        for line in proc.stdout:  # until both ranks have started (their SIGTERM handler is set)
            lines.append(line)
            if sum("napper rank" in x and "started" in x for x in lines) == 2:
                break
        launcher = psutil.Process(proc.pid)
        tree = [launcher, *launcher.children(recursive=True)]  # forkserver and ranks too
        for _ in range(3):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.05)
        proc.wait(timeout=RUN_TIMEOUT)
    finally:  # whatever is left of its tree (a rank of a launcher that did not wait for it)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(tree, timeout=10)
        proc.kill()
        proc.wait()
    out = proc.stdout.read()  # every writer has ended: no wait
    text = "".join(lines) + out
    assert text.count("napper: ended after SIGTERM") == 2, text[-3000:]
    assert "Unable to shutdown process" not in text, text[-3000:]
