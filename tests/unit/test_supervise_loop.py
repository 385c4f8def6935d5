"""The real Supervisor loop, a real SQLite store and real logs, driven through the fake backend
(no torchrun, no gloo): a run that reports and succeeds, a failure that is restarted from the
logs' error, a hang, and `gpufleet stop`. The recorded status and events are what users read."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.backends.base import Prepared
from gpufleet.backends.fake import Exit, FakeBackend, FakeRun, Line, Pause, Send, WorkerEvent
from gpufleet.lifecycle import clusters, jobs
from gpufleet.spec import ClusterSpec, JobSpec
from gpufleet.status import JobStatus
from gpufleet.store import Cluster, Job, Store
from gpufleet.supervise.supervisor import Supervisor


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFLEET_TELEMETRY", "0")
    return Store(url=f"sqlite:///{tmp_path}/s.db")


def _job(store: Store, backend: FakeBackend, **fields: object) -> tuple[Job, Cluster]:
    cluster = clusters.launch(store, ClusterSpec.parse({"gpu": "cpu", "count": 2, "name": "dev"}),
                              backend.discover())
    spec = JobSpec(script="train.py", name="j", **fields)  # type: ignore[arg-type]
    return jobs.create(store, spec, cluster, 2), cluster


def _run(store: Store, backend: FakeBackend, stop_after_s: float | None = None,
         **fields: object) -> tuple[Job, list[tuple[str, str]], list[str]]:
    """Run the job to its end (in a thread: the test process keeps its signal handlers)."""
    job, cluster = _job(store, backend, **fields)
    said: list[str] = []
    sup = Supervisor(store, job, cluster, backend, on_line=lambda _r, text: said.append(text))
    done: list[Job] = []
    thread = threading.Thread(target=lambda: done.append(sup.run()))
    thread.start()
    if stop_after_s is not None:
        time.sleep(stop_after_s)
        jobs.mark_stop_requested(store, job.id)
        sup.request_stop("stopped by SIGTERM (gpufleet stop, or the system)")
    thread.join(timeout=30)
    assert done, "the supervisor did not end"
    return done[0], [(e.kind, e.reason) for e in jobs.events(store, job.id)], said


def _reports(steps: int, loss: float = 2.0) -> Iterator[WorkerEvent]:
    for step in range(1, steps + 1):
        for rank in (0, 1):
            yield Send({"t": time.time(), "rank": rank, "step": step, "samples": 8,
                        "loss": loss, "total_steps": steps})


def test_a_run_that_reports_and_exits_0_succeeds(store: Store) -> None:
    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield Line("[rank0]:hello")
        yield from _reports(3)
        yield Pause(0.3)  # the reports reach the socket before the exit is seen
        yield Exit(0)

    backend = FakeBackend(handler)
    job, events, said = _run(store, backend)
    assert job.status == JobStatus.SUCCEEDED and job.reason == "all workers exited 0"
    assert (job.step, job.total_steps, job.exit_code, job.samples) == (3, 3, 0, 24)
    assert job.samples_per_s is not None and job.samples_per_s > 0  # the scaling yardstick
    assert [k for k, _ in events] == ["starting", "running", "succeeded"]
    assert said == ["hello"]
    assert (Path(job.job_dir) / "logs" / "rank0.log").read_text() == "hello\n"
    assert clusters.get(store, "dev").status == "running"  # a shared cluster is kept
    assert backend.starts[0].env["GPUFLEET_RUN"] == "1"


def test_a_failure_is_restarted_and_the_second_run_succeeds(store: Store) -> None:
    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield from _reports(2)
        yield Pause(0.3)
        if run.number == 1:
            yield Line("[rank1]:Traceback (most recent call last):")
            yield Line("[rank1]:ValueError: boom")
            yield Exit(1)
        yield Exit(0)

    backend = FakeBackend(handler)
    job, events, said = _run(store, backend, max_restarts=2)
    assert job.status == JobStatus.SUCCEEDED
    kinds = [k for k, _ in events]
    assert kinds == ["starting", "running", "worker_failed", "restarting", "running", "succeeded"]
    restarting = dict(events)["restarting"]
    assert restarting == ("rank 1 failed (exit code 1): ValueError: boom; restart 1 of 2 now, "
                          "gpufleet holds no checkpoint: the script restarts as written (it may "
                          "resume from its own checkpoints)")
    assert events[1] == ("running", "2 worker(s) on dev")
    assert events[4] == ("running", "2 worker(s) on dev (run 2)")
    assert any(s.startswith("gpufleet: rank 1 failed (exit code 1)") for s in said)
    assert [r.env["GPUFLEET_RUN"] for r in backend.starts] == ["1", "2"]
    assert "restart 1: rank 1 failed" in (Path(job.job_dir) / "job.log").read_text()


def test_a_failure_with_restarts_off_reads_from_the_logs(store: Store) -> None:
    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield Line("[rank1]:Traceback (most recent call last):")
        yield Line("[rank1]:ValueError: boom")
        yield Exit(3)

    job, _, _ = _run(store, FakeBackend(handler))
    assert job.status == JobStatus.FAILED and job.exit_code == 3
    assert job.reason == ("rank 1 failed: ValueError: boom (exit code 3); last lines:\n"
                          "Traceback (most recent call last):\nValueError: boom")


def test_gpufleet_stop_ends_the_workers_and_records_its_reason(store: Store) -> None:
    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield from _reports(1)
        yield Pause(60.0)
        yield Exit(0)

    t0 = time.monotonic()
    job, events, _ = _run(store, FakeBackend(handler), stop_after_s=0.5)
    assert time.monotonic() - t0 < 15
    assert job.status == JobStatus.STOPPED and job.reason == jobs.STOP_REQUESTED
    assert events[-1] == ("stopped", jobs.STOP_REQUESTED)


def test_a_supervisor_error_fails_the_job_with_its_traceback_kept(store: Store) -> None:
    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        raise OSError("no such launcher")
        yield Exit(0)

    class Broken(FakeBackend):
        def start(self, prepared: Prepared, env: dict[str, str], cwd: Path) -> object:  # type: ignore[override]
            raise OSError("no such launcher")

    job, _, _ = _run(store, Broken(handler))
    assert job.status == JobStatus.FAILED
    assert job.reason == "supervisor error: OSError: no such launcher"
    assert "OSError" in (Path(job.job_dir) / "supervisor-error.log").read_text()


def test_workers_that_go_quiet_are_ended_as_hung(store: Store) -> None:
    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield from _reports(2)
        yield Pause(60.0)  # alive, but silent
        yield Exit(0)

    t0 = time.monotonic()
    job, events, _ = _run(store, FakeBackend(handler), hang_timeout="1s")
    assert time.monotonic() - t0 < 15
    assert job.status == JobStatus.FAILED and job.exit_code is None
    assert job.reason.startswith("no rank reported for 1 s (hang timeout 1 s)")
    assert job.reason.endswith("(restarts are off: --max-restarts 0)")
    assert [k for k, _ in events] == ["starting", "running", "hang", "failed"]


def test_datagrams_without_the_jobs_signature_change_nothing_and_are_told_once(
        store: Store) -> None:
    """The adversarial trial through the real loop: a stranger's bare exit_for_resize to a
    non-elastic job (it used to train a second time), fake progress and a fake checkpoint."""
    forged = [Send({"rank": 0, "event": "exit_for_resize", "step": 2}, signed=False),
              Send({"rank": 0, "event": "checkpoint", "step": 10**9, "bytes": 1}, signed=False),
              *(Send({"t": time.time(), "rank": r, "step": 10**9, "pid": 1}, signed=False)
                for r in (0, 1) for _ in range(20))]

    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield from _reports(2)
        yield from forged
        yield Pause(0.3)
        yield Exit(0)

    backend = FakeBackend(handler)
    job, events, _ = _run(store, backend)
    assert job.status == JobStatus.SUCCEEDED and len(backend.starts) == 1
    assert job.step == 2
    kinds = [k for k, _ in events]
    assert [k for k in kinds if k != "reports_rejected"] == ["starting", "running", "succeeded"]
    told = [text for k, text in events if k == "reports_rejected"]
    # the first drop is told at once; a burst split over two reads of the socket is told in
    # full at the end: one or two events, never one per datagram
    assert 1 <= len(told) <= 2
    assert f"({len(forged)} so far: {len(forged)} unsigned)" in told[-1]
    assert "GPUFLEET_REPORT_KEY" not in (Path(job.job_dir) / "command.json").read_text()


def test_a_rank_that_goes_quiet_is_told_by_status_before_the_hang_timeout(store: Store) -> None:
    """Reports, then silence with the workers alive: `status` (text and --json, the dashboard's
    detail and list) says "no report for N s" once rank 0's newest report is older than the
    limit, N from the record and `now`; the 5-minute hang timeout is far off."""
    from gpufleet import ui, views
    from gpufleet.supervise.view import STALE_FLOOR_S

    quiet = threading.Event()

    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        yield from _reports(3)
        quiet.set()
        yield Pause(60.0)  # alive, but silent
        yield Exit(0)

    backend = FakeBackend(handler)
    job, cluster = _job(store, backend)
    sup = Supervisor(store, job, cluster, backend)
    thread = threading.Thread(target=sup.run)
    thread.start()
    try:
        assert quiet.wait(30)
        deadline = time.monotonic() + 30
        while jobs.get(store, "j").step != 3:  # the reports reach the store within a second
            assert time.monotonic() < deadline, "the reports never reached the store"
            time.sleep(0.05)
        last = jobs.get(store, "j").last_report_at
        assert last is not None
        # rank 0's steps came in milliseconds, so the limit is the floor
        soon = views.job_detail(store, "j", last + STALE_FLOOR_S - 1)
        assert soon["status"] == "running" and soon["no_report_s"] is None
        later = views.job_detail(store, "j", last + 45.0)
        assert later["no_report_s"] == 45.0
        assert "no report for 45 s" in _text(ui.status_view(later))
        [(_, _, listed)] = views.views(store, last + 45.0)
        assert listed.no_report_s == 45.0
    finally:
        sup.request_stop("stopped by SIGTERM (gpufleet stop, or the system)")
        thread.join(timeout=30)
    assert jobs.get(store, "j").status == JobStatus.STOPPED


def _text(renderable: object) -> str:
    import io

    from rich.console import Console

    console = Console(width=120, file=io.StringIO())
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]
