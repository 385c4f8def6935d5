"""supervise.blame (which rank's exception is the reason), the traceback kept in a rank's tail,
and the comm rule staying quiet for a peer of a rank that failed with an ordinary exception."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from gpufleet.status import JobStatus
from gpufleet.supervise import outcome
from gpufleet.supervise.blame import ErrorRecord, Tail, blame, parse, signalled, summary
from gpufleet.supervise.logs import PIN_HORIZON, TAIL_LINES, LogSink, RankTail
from gpufleet.telemetry.diagnose import Inputs, diagnose
from gpufleet.telemetry.tracebacks import first_error, is_comm_failure, is_knock_on

SEC = 1_000_000_000
BOOM = "RuntimeError: boom at step 3 on rank 1"
CLOSED = ("RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
          "Connection closed by peer [127.0.0.1]:45959. This is typically caused by a remote "
          "worker crashing.")


def rec(rank: int, error: str, t: float, stack: str = "") -> ErrorRecord:
    kind = error.split(":", 1)[0].rsplit(".", 1)[-1]
    return ErrorRecord(rank, kind, error, stack or f"Traceback (most recent call last):\n  x\n{error}\n",
                       int(t * SEC))


# ---------------------------------------------------------------- blame

def test_the_earliest_cause_is_blamed_not_the_peer_that_saw_it_go() -> None:
    # the peer's record is written later, and torchrun then SIGTERMed it
    found = blame([rec(0, CLOSED, 10.5), rec(1, BOOM, 10.0)], {0: -15, 1: 1})
    assert found is not None
    assert (found.rank, found.code, found.error) == (1, 1, BOOM)
    assert found.lines[-1] == BOOM and found.lines[0].startswith("Traceback")


def test_a_knock_on_is_never_blamed_even_when_it_is_earliest_or_its_rank_exited_1() -> None:
    found = blame([rec(0, CLOSED, 1.0), rec(2, "ValueError: bad batch", 5.0)], {0: 1, 2: 1})
    assert found is not None and found.rank == 2


def test_a_rank_torchrun_ended_with_a_signal_after_the_first_failure_is_never_blamed() -> None:
    # rank 0's ordinary error came after rank 1's, and torchrun SIGTERMed rank 0 (or a shell's
    # 128+15): rank 1 is the cause
    for code in (-15, 143):
        found = blame([rec(0, "KeyError: 'x'", 2.0), rec(1, BOOM, 1.0)], {0: code, 1: 1})
        assert found is not None and (found.rank, found.code) == (1, 1)
    found = blame([rec(0, "KeyError: 'x'", 1.0), rec(1, BOOM, 2.0), rec(2, CLOSED, 0.5)],
                  {0: -15, 1: 1, 2: 1})
    assert found is not None and found.rank == 1  # rank 2's knock-on exited on its own first


def test_a_rank_that_raised_first_and_was_ended_while_shutting_down_is_the_cause() -> None:
    # rank 1 raised; its process group closing made rank 0 raise and exit first, and torchrun
    # then SIGTERMed rank 1 still in its shutdown (seen in 1 of 20 real runs)
    found = blame([rec(1, BOOM, 10.0), rec(0, CLOSED, 10.2)], {0: 1, 1: -15})
    assert found is not None and (found.rank, found.code, found.error) == (1, None, BOOM)
    assert blame([rec(1, BOOM, 10.0)], {1: -15}) is not None  # the only record


def test_only_knock_ons_leave_it_to_the_logs() -> None:
    assert blame([rec(0, CLOSED, 1.0), rec(1, "torch.distributed.DistNetworkError: gone", 2.0)],
                 {}) is None
    assert blame([], {}) is None


def test_ties_go_to_the_lower_rank_and_an_unknown_code_stays_unknown() -> None:
    found = blame([rec(3, "ValueError: a", 7.0), rec(1, "ValueError: b", 7.0)], {})
    assert found is not None and (found.rank, found.code, found.error) == (1, None, "ValueError: b")


def test_a_collective_timeout_of_its_own_is_a_cause() -> None:
    timeout = "torch.distributed.DistBackendError: Watchdog caught collective operation timeout"
    found = blame([rec(0, timeout, 1.0)], {0: 1})
    assert found is not None and found.error == timeout


def test_signalled_codes() -> None:
    assert [signalled(c) for c in (None, 0, 1, 2, -9, -15, 137, 143)] == [
        False, False, False, False, True, True, True, True]


# ---------------------------------------------------------------- parse

def torch_record(message: str, ts: str = "100", **extra: str) -> dict[str, object]:
    """The layout torch's ErrorHandler.record_exception writes."""
    return {"message": {"message": message,
                        "extraInfo": {"py_callstack": f"Traceback ...\n{message}\n", "timestamp": ts,
                                      **extra}}}


def test_parse_torchs_own_record_with_the_rank_of_its_folder() -> None:
    r = parse(torch_record("KeyError: 'k'"), 2)
    assert r is not None and (r.rank, r.kind, r.error, r.time_ns) == (2, "KeyError", "KeyError: 'k'",
                                                                     100 * SEC)


def test_parse_prefers_the_rank_and_time_the_record_names() -> None:
    data = torch_record("DistNetworkError: x", time_ns="100500000000", rank="7",
                        exception_type="torch.distributed.DistNetworkError")
    r = parse(data, 0)
    assert r is not None and (r.rank, r.kind, r.time_ns) == (7, "DistNetworkError", 100_500_000_000)


def test_parse_refuses_what_holds_no_exception() -> None:
    assert parse({"message": "Signal 15 (SIGTERM) received", "timestamp": 3}, 0) is None
    assert parse({}, 0) is None
    assert parse(torch_record("KeyError: 'k'"), None) is None  # no rank known
    assert parse({"message": {"message": "", "extraInfo": {}}}, 0) is None


# ---------------------------------------------------------------- torchrun's summary

SUMMARY = """\
Failures:
[1]:
  time      : 2026-12-02_03:26:40
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 8017)  (SIGTERM)
  error_file: /j/torchrun/r_x/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
    File "train.py", line 38, in <module>
  RuntimeError: Connection closed by peer
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 9 (local_rank: 1)
  exitcode  : 1 (pid: 8033)
  error_file: /j/torchrun/r_x/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
  RuntimeError: boom
""".splitlines()


def test_summary_reads_codes_error_files_and_the_root_cause() -> None:
    s = summary(["[agent] noise", *SUMMARY])
    assert s.codes == {0: -15, 9: 1}
    assert s.files == {"/j/torchrun/r_x/attempt_0/0/error.json": 0,
                       "/j/torchrun/r_x/attempt_0/1/error.json": 9}
    assert s.root == 9
    assert summary(["  error_file: <N/A>", "  exitcode  : 1"]).files == {}


# ---------------------------------------------------------------- a rank's tail keeps its traceback

def test_a_traceback_pushed_out_by_later_output_is_kept_at_the_front() -> None:
    tail = RankTail()
    tail.append("step 3")
    for line in ("Traceback (most recent call last):", '  File "t.py", line 44, in <module>',
                 "    raise RuntimeError(...)", BOOM):
        tail.append(line)
    noise = [f"Overriding: noise_{i} = {i}" for i in range(TAIL_LINES + 5)]
    for line in noise:
        tail.append(line)
    lines = list(tail)
    assert lines[:4] == ["Traceback (most recent call last):", '  File "t.py", line 44, in <module>',
                         "    raise RuntimeError(...)", BOOM]
    assert lines[4:] == noise[-TAIL_LINES:] and len(tail) == len(lines)
    err = first_error(f"[rank 1] {ln}" for ln in lines)
    assert err is not None and (err.rank, err.line) == (1, BOOM)


def test_a_traceback_handled_long_ago_is_not_kept() -> None:
    tail = RankTail()
    for line in ("Traceback (most recent call last):", "ValueError: handled, logged"):
        tail.append(line)
    for i in range(PIN_HORIZON):
        tail.append(f"step {i}")
    assert "ValueError: handled, logged" not in list(tail)
    assert list(tail) == [f"step {i}" for i in range(PIN_HORIZON - TAIL_LINES, PIN_HORIZON)]


def test_a_traceback_still_in_the_tail_is_not_repeated() -> None:
    tail = RankTail()
    for line in ("a", "Traceback (most recent call last):", BOOM, "b"):
        tail.append(line)
    assert list(tail) == ["a", "Traceback (most recent call last):", BOOM, "b"]


# ---------------------------------------------------------------- the sink reads the records

def _sink_with_records(tmp_path: Path, records: dict[str, dict[str, object]], since: float,
                       agent: list[str]) -> LogSink:
    sink = LogSink(tmp_path, world_size=2)
    sink.run_started(since)
    for rel, data in records.items():
        path = tmp_path / "torchrun" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    for line in agent:
        sink.write(line + "\n")
    return sink


def test_the_sink_blames_the_recorded_exception_not_the_noise(tmp_path: Path) -> None:
    sink = _sink_with_records(tmp_path, {
        "r_x/attempt_0/0/error.json": torch_record(CLOSED, "200"),
        "r_x/attempt_0/1/error.json": torch_record(BOOM, "199"),
    }, since=0.0, agent=["rank      : 0 (local_rank: 0)", "exitcode  : -15 (pid: 1)"])
    for i in range(50):
        sink.write(f"[rank1]:Overriding: noise_{i} = {i}\n")
    tail = sink.failure(single_node=True)
    sink.close()
    assert tail == Tail(1, None, ("Traceback ...", BOOM), BOOM, recorded=True)
    status, reason = outcome.final(outcome.Ending(1, None, None, None, False), None, "x", tail)
    assert (status, reason) == (JobStatus.FAILED, f"rank 1 failed (exit code 1): {BOOM}")


def test_records_of_an_earlier_run_or_another_node_are_not_read(tmp_path: Path) -> None:
    sink = _sink_with_records(tmp_path, {"old/attempt_0/1/error.json": torch_record(BOOM)},
                              since=0.0, agent=[])
    old = tmp_path / "torchrun" / "old/attempt_0/1/error.json"
    os.utime(old, (1000.0, 1000.0))
    sink.run_started(2000.0)
    sink.write("[rank1]:Traceback (most recent call last):\n")
    sink.write("[rank1]:ValueError: from the log\n")
    assert sink.failure(single_node=True) == Tail(
        1, None, ("Traceback (most recent call last):", "ValueError: from the log"),
        "ValueError: from the log")
    sink.run_started(0.0)  # now the file counts, but a folder is a local rank only on one node
    assert sink.failure(single_node=False).recorded is False
    assert sink.failure(single_node=True).recorded is True
    sink.close()


def test_without_records_a_traceback_scrolled_out_still_names_the_error(tmp_path: Path) -> None:
    sink = LogSink(tmp_path, world_size=2)
    sink.write("[rank1]:Traceback (most recent call last):\n")
    sink.write(f"[rank1]:{BOOM}\n")
    for i in range(50):
        sink.write(f"[rank1]:Overriding: noise_{i} = {i}\n")
    tail = sink.failure(single_node=True)
    sink.close()
    assert (tail.rank, tail.error, tail.recorded) == (1, BOOM, False)


def test_a_nodes_summary_scrolled_out_of_the_agents_tail_still_names_the_cause(
        tmp_path: Path) -> None:
    """Two nodes' summaries, the worker's first, each after a long traceback of the agent's
    (warm workers' failures are logged with one): the head's alone names its victim, rank 0."""
    sink = LogSink(tmp_path, world_size=2)
    sink.write("[worker1 rank1]:probe rank 1 failing as asked\n")
    sink.write("[head rank0]:[rank0]: Traceback (most recent call last):\n")
    sink.write(f"[head rank0]:[rank0]: {CLOSED}\n")
    for node, rank in (("worker1", 1), ("head", 0)):
        sink.write(f"[{node}]: Traceback (most recent call last):\n")
        for i in range(TAIL_LINES):
            sink.write(f'[{node}]:   File "api.py", line {i}, in run\n')
        for line in ("Root Cause (first observed failure):", f"  rank      : {rank} (local_rank: 0)",
                     "  exitcode  : 1 (pid: 7)", "  error_file: <N/A>"):
            sink.write(f"[{node}]: {line}\n")
        sink.write(f"[{node}]: {'=' * 60}\n")
    tail = sink.failure(single_node=False)
    sink.new_run("restart 1")
    assert list(sink.summaries) == []  # the next failure reads the next run's summaries
    sink.close()
    assert (tail.rank, tail.rank_code) == (1, 1)


def test_a_lost_nodes_line_outlives_the_survivors_last_words(tmp_path: Path) -> None:
    """The driver names the lost node, then drains what the survivors printed as they ended
    (their torchrun's traceback and summary): the NodeLostError line is still the run's."""
    from gpufleet.backends.exits import NODE_LOST_EXIT, lost_line

    sink = LogSink(tmp_path, world_size=2)
    lost = "NodeLostError: node worker1 (10.0.0.2) left the Ray cluster mid-job"
    sink.write(lost + "\n")
    for i in range(TAIL_LINES * 3):
        sink.write(f'[head]:   File "api.py", line {i}, in run\n')
    assert lost not in sink.tail(None)  # scrolled out of the agent's tail
    assert lost_line(NODE_LOST_EXIT, sink.agent_lines()) == lost
    sink.new_run("restart 1")
    assert lost_line(NODE_LOST_EXIT, sink.agent_lines()) is None  # the next run's own
    sink.close()


# ---------------------------------------------------------------- the comm rule

JOB = Inputs(now=1000.0, status="failed", started_at=900.0, last_report_at=990.0, step=3,
             seconds_per_step=0.1, world_size=2, on_gpu=False, gpu="cpu", gpu_bf16=False,
             precision="fp32", strategy="ddp")


def rules(tail: tuple[str, ...]) -> set[str]:
    return {f.rule for f in diagnose(replace(JOB, log_tail=tail))}


def test_no_comm_finding_for_peers_of_a_rank_that_raised_an_ordinary_error() -> None:
    nccl_on_cpu = "RuntimeError: Distributed package doesn't have NCCL built in"
    for error in (BOOM, nccl_on_cpu):
        tail = ("[rank 0] Traceback (most recent call last):", f"[rank 0] {CLOSED}",
                "[rank 1] Traceback (most recent call last):", f"[rank 1] {error}")
        assert rules(tail) == {"worker_error"}, error


def test_a_real_collective_failure_is_still_a_comm_finding() -> None:
    tail = ("[rank 0] Traceback (most recent call last):",
            "[rank 0] torch.distributed.DistBackendError: Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600054 milliseconds",
            "[rank 1] Traceback (most recent call last):", f"[rank 1] {CLOSED}")
    assert "comm_timeout" in rules(tail)


def test_kinds_of_errors() -> None:
    assert is_knock_on("RuntimeError", CLOSED) and is_knock_on("DistNetworkError", "x")
    assert not is_knock_on("RuntimeError", "Distributed package doesn't have NCCL built in")
    assert not is_comm_failure("RuntimeError", "Distributed package doesn't have NCCL built in")
    assert is_comm_failure("RuntimeError", "Timed out waiting 3000ms for recv operation")
    assert not is_knock_on("RuntimeError", BOOM) and not is_comm_failure("RuntimeError", BOOM)
