"""The supervisor's pure parts: log splitting, root-cause parsing, throughput/ETA, the job view."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from gpufleet.store import Cluster, Job
from gpufleet.supervise.logs import TAIL_LINES, LogSink, failed_rank, split_line
from gpufleet.supervise.progress import Report, Throughput, eta_seconds
from gpufleet.supervise.view import job_view, seconds_per_step

# ---------------------------------------------------------------- split_line


@pytest.mark.parametrize(
    ("line", "rank", "text"),
    [
        ("[rank3]:hello", 3, "hello"),
        ("[rank0]:loss 1.5\n", 0, "loss 1.5\n"),
        ("[rank12]: spaced", 12, " spaced"),
        ("[rank1]:", 1, ""),
        ("[rank2]:[rank5]:nested", 2, "[rank5]:nested"),
    ],
)
def test_split_rank_lines(line: str, rank: int, text: str) -> None:
    assert split_line(line) == (rank, text)


@pytest.mark.parametrize(
    "line",
    [
        "INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group",
        "W1129 15:00:00.000 torch/distributed/run.py:792] *****",
        " [rank3]:indented is not a prefix",
        "[rank]:no number",
        "[rankx]:not a number",
        "",
    ],
)
def test_agent_lines_have_no_rank(line: str) -> None:
    assert split_line(line) == (None, line)


# ---------------------------------------------------------------- LogSink


def test_log_sink_writes_per_rank_agent_and_combined(tmp_path: Path) -> None:
    sink = LogSink(tmp_path)
    assert sink.write("[rank0]:hello\n") == (0, "hello\n")
    assert sink.write("[rank1]:world") == (1, "world")
    assert sink.write("agent says hi\n") == (None, "agent says hi\n")
    sink.write("[rank0]:again")
    sink.close()
    assert (tmp_path / "logs" / "rank0.log").read_text() == "hello\nagain\n"
    assert (tmp_path / "logs" / "rank1.log").read_text() == "world\n"
    assert (tmp_path / "logs" / "agent.log").read_text() == "agent says hi\n"
    combined = "[rank0]:hello\n[rank1]:world\nagent says hi\n[rank0]:again\n"
    assert (tmp_path / "job.log").read_text() == combined


def test_log_sink_appends_across_sinks(tmp_path: Path) -> None:
    # a restarted supervisor keeps the earlier output
    first = LogSink(tmp_path)
    first.write("[rank0]:before")
    first.close()
    second = LogSink(tmp_path)
    second.write("[rank0]:after")
    second.close()
    assert (tmp_path / "logs" / "rank0.log").read_text() == "before\nafter\n"


def test_log_sink_tails_keep_recent_lines_per_rank(tmp_path: Path) -> None:
    sink = LogSink(tmp_path)
    extra = 5
    for i in range(TAIL_LINES + extra):
        sink.write(f"[rank0]:line {i}\n")
    sink.write("[rank1]:only one\n")
    sink.write("agent line\n")
    assert sink.tail(0) == [f"line {i}" for i in range(extra, TAIL_LINES + extra)]
    assert sink.tail(1) == ["only one"]
    assert sink.tail(None) == ["agent line"]
    assert sink.tail(7) == []
    sink.close()
    # the file keeps everything, the tail only the last lines
    assert len((tmp_path / "logs" / "rank0.log").read_text().splitlines()) == TAIL_LINES + extra


# ---------------------------------------------------------------- failed_rank

ROOT_CAUSE_BLOCK = """\
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_15:00:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 1234)""".splitlines()


def torchrun_summary(root: tuple[int, int], others: list[tuple[int, int]]) -> list[str]:
    """The agent's summary as torch.distributed.elastic prints it (_MSG_FORMAT_TEMPLATE):
    other failures first, then the root cause."""

    def block(idx: int, rank: int, code: int) -> str:
        return (f"[{idx}]:\n  time      : 2026-11-29_15:00:0{idx}\n  host      : box\n"
                f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: {1000 + rank})\n"
                "  error_file: <N/A>\n"
                "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")

    other = "\n".join(block(i + 1, r, c) for i, (r, c) in enumerate(others)) or "  <NO_OTHER_FAILURES>"
    text = ("=" * 60 + "\ntrain.py FAILED\n" + "-" * 60 + "\nFailures:\n" + other + "\n" + "-" * 60
            + "\nRoot Cause (first observed failure):\n" + block(0, *root) + "\n" + "=" * 60)
    return text.splitlines()


TB = "Traceback (most recent call last):"


def tails_of(**ranks: list[str]) -> dict[int | None, deque[str]]:
    """rank_tails as LogSink keeps them, from keyword arguments r0=[...], r3=[...]."""
    return {int(k.removeprefix("r")): deque(v) for k, v in ranks.items()}


def test_failed_rank_from_root_cause_block() -> None:
    assert failed_rank(ROOT_CAUSE_BLOCK, {}) == (1, 1)


def test_failed_rank_from_full_summary_without_other_failures() -> None:
    lines = ["INFO:torch.distributed.elastic:starting", *torchrun_summary((3, 7), [])]
    assert failed_rank(lines, {}) == (3, 7)


def test_failed_rank_negative_exit_code_for_signals() -> None:
    assert failed_rank(torchrun_summary((2, -9), []), {}) == (2, -9)


def test_failed_rank_is_the_root_cause_not_the_first_listed_failure() -> None:
    # torchrun lists the other failures before the root cause
    lines = torchrun_summary(root=(1, 1), others=[(0, -15), (2, -15)])
    assert failed_rank(lines, {}) == (1, 1)


def test_failed_rank_root_cause_wins_over_knock_on_tracebacks() -> None:
    tails = tails_of(r0=[TB, "torch.distributed.DistBackendError: NCCL communicator was aborted"],
                     r2=[TB, "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"])
    lines = torchrun_summary(root=(1, -9), others=[(0, 1), (2, 1)])
    assert failed_rank(lines, tails) == (1, -9)


def test_failed_rank_prefers_a_real_error_over_torchruns_first_exit() -> None:
    # rank 0 exited first because its peer vanished; rank 2 raised the real error
    tails = tails_of(r0=[TB, "RuntimeError: Connection reset by peer"],
                     r2=[TB, '  File "train.py", line 9', "ValueError: bad batch"])
    lines = torchrun_summary(root=(0, 1), others=[(2, 7)])
    assert failed_rank(lines, tails) == (2, 7)


def test_failed_rank_lowest_of_several_real_errors() -> None:
    tails = tails_of(r3=[TB, "torch.OutOfMemoryError: CUDA out of memory"],
                     r1=[TB, "torch.OutOfMemoryError: CUDA out of memory"], r0=["step 5 loss 2.0"])
    assert failed_rank([], tails) == (1, None)


def test_failed_rank_falls_back_to_first_rank_with_traceback() -> None:
    tails = tails_of(r3=[TB, "ValueError: bad"], r0=["step 1 loss 2.0"], r2=[TB, "RuntimeError: boom"])
    tails[None] = deque(["ChildFailedError in the agent"])
    assert failed_rank(["some agent line"], tails) == (2, None)


def test_failed_rank_all_knock_ons_without_summary_takes_the_first() -> None:
    tails = tails_of(r3=[TB, "BrokenPipeError: [Errno 32] Broken pipe"],
                     r1=[TB, "torch.distributed.DistNetworkError: Connection reset by peer"])
    assert failed_rank([], tails) == (1, None)


def test_failed_rank_ignores_the_agent_and_clean_ranks() -> None:
    tails = tails_of(r0=["done"], r1=["done"])
    tails[None] = deque([TB])
    assert failed_rank([], tails) == (None, None)


def test_failed_rank_exit_code_only_for_the_chosen_rank() -> None:
    # an exitcode line with no rank before it belongs to nobody
    assert failed_rank(["  exitcode  : 1 (pid: 99)"], tails_of(r1=[TB, "KeyError: 'x'"])) == (1, None)


# ---------------------------------------------------------------- Throughput


def reports(times_steps: list[tuple[float, int]], samples: int | None = 8) -> list[Report]:
    return [Report(t=t, rank=0, step=s, samples=samples) for t, s in times_steps]


def test_throughput_needs_two_reports() -> None:
    tp = Throughput()
    assert tp.samples_per_s() is None
    assert tp.seconds_per_step() is None
    assert tp.overall_samples_per_s() is None
    tp.add(Report(t=100.0, rank=0, step=1, samples=32))
    assert tp.samples_per_s() is None
    assert tp.seconds_per_step() is None
    assert tp.overall_samples_per_s() is None


def test_throughput_over_short_run() -> None:
    tp = Throughput(window_s=10.0)
    for r in reports([(100.0, 1), (102.0, 2), (104.0, 3)], samples=32):
        tp.add(r)
    # the first report only marks the time: 2 reports x 32 samples over 4 s
    assert tp.samples_per_s() == pytest.approx(2 * 32 / (104 - 100))
    assert tp.seconds_per_step() == pytest.approx((104 - 100) / (3 - 1))
    assert tp.overall_samples_per_s() == pytest.approx(2 * 32 / (104 - 100))


def test_throughput_window_follows_current_speed() -> None:
    tp = Throughput(window_s=10.0)
    # slow start: step 1 at t=0, step 2 at t=5, then one step per second: step k at t = k + 3
    points = [(0.0, 1)] + [(float(k + 3), k) for k in range(2, 21)]
    for r in reports(points, samples=8):
        tp.add(r)
    # last report t=23; the window keeps reports at most 10 s older: t=13 (step 10) .. t=23 (step 20)
    assert tp.points[0][:2] == (13.0, 10)
    assert tp.samples_per_s() == pytest.approx((20 - 10) * 8 / (23 - 13))
    assert tp.seconds_per_step() == pytest.approx((23 - 13) / (20 - 10))
    # whole run: every report after the first (19 x 8 samples) over 23 s
    assert tp.overall_samples_per_s() == pytest.approx(19 * 8 / 23)


def test_throughput_window_keeps_at_least_two_points() -> None:
    tp = Throughput(window_s=1.0)
    for r in reports([(0.0, 1), (60.0, 2), (120.0, 3)], samples=4):
        tp.add(r)
    assert len(tp.points) == 2
    assert tp.samples_per_s() == pytest.approx(4 / (120 - 60))
    assert tp.seconds_per_step() == pytest.approx(120 - 60)


def test_throughput_without_samples() -> None:
    tp = Throughput()
    for r in reports([(0.0, 1), (1.0, 2), (2.0, 3)], samples=None):
        tp.add(r)
    assert tp.samples_per_s() is None  # unknown, not zero: the script never said its samples
    assert tp.overall_samples_per_s() is None
    assert tp.seconds_per_step() == pytest.approx(1.0)


def test_throughput_no_step_progress_has_no_step_time() -> None:
    tp = Throughput()
    for r in reports([(0.0, 5), (1.0, 5)]):
        tp.add(r)
    assert tp.seconds_per_step() is None


def test_throughput_same_timestamp_has_no_rate() -> None:
    tp = Throughput()
    for r in reports([(7.0, 1), (7.0, 2)]):
        tp.add(r)
    assert tp.samples_per_s() is None
    assert tp.overall_samples_per_s() is None


# ---------------------------------------------------------------- eta_seconds


def test_eta_seconds() -> None:
    assert eta_seconds(10, 100, 0.5) == pytest.approx((100 - 10) * 0.5)
    assert eta_seconds(100, 100, 0.5) == 0
    assert eta_seconds(120, 100, 0.5) == 0  # past the end: never negative


@pytest.mark.parametrize(("step", "total", "sps"), [(None, 100, 1.0), (1, None, 1.0), (1, 100, None)])
def test_eta_unknown(step: int | None, total: int | None, sps: float | None) -> None:
    assert eta_seconds(step, total, sps) is None


# ---------------------------------------------------------------- job_view

CREATED, STARTED = 1_000.0, 1_010.0
RATE = 8 * (2.20 + 0.25)


def make_job(**kw: object) -> Job:
    fields: dict[str, object] = dict(
        name="train-ab12", status="running", world_size=8, created_at=CREATED, started_at=STARTED,
        step=11, total_steps=101, first_step_at=1_020.0, last_report_at=1_070.0, samples=640,
        loss=1.25, first_loss=4.5, samples_per_s=12.8, reason=None, exit_code=None,
        billed_micro_usd=0, run_from_micro_usd=0)  # its run began with its cluster (its own)
    fields.update(kw)
    return Job(**fields)


def make_cluster(**kw: object) -> Cluster:
    fields: dict[str, object] = dict(name="llama", gpu="H100-SXM", usd_per_hour=RATE,
                                     price_book="marketplace", started_at=CREATED, stopped_at=None,
                                     status="running")
    fields.update(kw)
    return Cluster(**fields)


def test_seconds_per_step_since_first_report() -> None:
    # step 1 ended at 1020, step 11 at 1070: 10 steps in 50 s
    assert seconds_per_step(make_job()) == pytest.approx((1_070 - 1_020) / (11 - 1))
    assert seconds_per_step(make_job(step=1)) is None
    assert seconds_per_step(make_job(first_step_at=None)) is None


def test_job_view_running() -> None:
    now = 1_100.0
    view = job_view(make_job(), make_cluster(), now)
    assert (view.job, view.cluster, view.gpu, view.status) == ("train-ab12", "llama", "H100-SXM", "running")
    assert view.elapsed_s == pytest.approx(now - STARTED)
    assert view.eta_s == pytest.approx((101 - 11) * (1_070 - 1_020) / (11 - 1))
    assert view.cost_usd == pytest.approx(RATE * (now - CREATED) / 3600)
    assert view.usd_per_hour == pytest.approx(RATE)
    assert view.price_book == "marketplace"
    assert (view.step, view.total_steps, view.samples, view.world_size) == (11, 101, 640, 8)
    assert view.as_dict()["eta_s"] == view.eta_s


def test_job_view_elapsed_from_creation_before_start() -> None:
    view = job_view(make_job(status="starting", started_at=None, step=None), make_cluster(), 1_030.0)
    assert view.elapsed_s == pytest.approx(1_030 - CREATED)
    assert view.eta_s is None  # no step yet


@pytest.mark.parametrize("status", ["succeeded", "failed", "stopped", "interrupted"])
def test_job_view_no_eta_once_ended(status: str) -> None:
    ended = 1_080.0
    view = job_view(make_job(status=status, ended_at=ended), make_cluster(), 5_000.0)
    assert view.eta_s is None
    assert view.elapsed_s == pytest.approx(ended - STARTED)  # frozen at the end


def test_job_view_no_eta_without_total_steps() -> None:
    assert job_view(make_job(total_steps=None), make_cluster(), 1_100.0).eta_s is None


def test_job_view_cost_frozen_after_cluster_stop() -> None:
    stopped = CREATED + 1_800
    cluster = make_cluster(status="stopped", stopped_at=stopped)
    job = make_job(status="succeeded", ended_at=stopped)
    early = job_view(job, cluster, stopped + 1)
    late = job_view(job, cluster, stopped + 86_400)
    assert early.cost_usd == pytest.approx(RATE * 1_800 / 3600)
    assert late.cost_usd == pytest.approx(early.cost_usd)


def test_job_view_cost_zero_when_cluster_never_started() -> None:
    view = job_view(make_job(status="starting"), make_cluster(status="pending", started_at=None), 2_000.0)
    assert view.cost_usd == 0.0


def test_failed_rank_reads_every_nodes_summary_and_skips_a_victims_root() -> None:
    """Two nodes, each torchrun with its own summary: the head's first
    exit is rank 0's knock-on, the worker's is rank 1's own `sys.exit(1)` (no traceback)."""
    head = torchrun_summary(root=(0, 1), others=[])
    worker = torchrun_summary(root=(1, 1), others=[])
    tails = tails_of(r0=[TB, "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed "
                             "by peer [127.0.0.1]:7388"], r1=["probe rank 1 failing as asked"])
    for agent in (head + worker, worker + head):
        assert failed_rank(agent, tails) == (1, 1)
    # with no victim among them, the first node's root cause stands
    assert failed_rank(head + worker, {}) == (0, 1)


def test_failed_rank_finds_an_own_exit_listed_behind_a_victims_root_cause() -> None:
    """Each node's torchrun saw a victim first (ranks 0 and 2, closed connections); rank 3's
    own `sys.exit(1)` is among the worker's other failures, and ranks SIGTERMed are not it."""
    closed = [TB, "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer"]
    tails = tails_of(r0=closed, r1=["step 3"], r2=closed, r3=["probe rank 3 failing as asked"])
    agent = [*torchrun_summary(root=(0, 1), others=[(1, -15)]),
             *torchrun_summary(root=(2, 1), others=[(3, 1)])]
    assert failed_rank(agent, tails) == (3, 1)


def test_failed_rank_finds_a_killed_rank_behind_a_peer_recorded_first() -> None:
    """Rank 1 was killed with SIGKILL; rank 0 raised on the closed connection and its error
    file's time made it torchrun's root cause before torchrun noticed rank 1, then torchrun
    ended it with SIGTERM. Neither exited with a code of its own: the kill is the cause."""
    closed = [TB, "RuntimeError: Got the following error when running the callback: "
              "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer"]
    tails = tails_of(r0=closed, r1=["step 12"])
    assert failed_rank(torchrun_summary(root=(0, -15), others=[(1, -9)]), tails) == (1, -9)
    # torchrun's own SIGTERM is no cause: with only victims, its root cause stands
    assert failed_rank(torchrun_summary(root=(0, -15), others=[(1, -15)]),
                       tails_of(r0=closed, r1=closed)) == (0, -15)
