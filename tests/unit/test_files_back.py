"""Files that come back from a node that does not see the job folder: framed on the node's
output, written into the job folder by the driver; and the Ray/Slurm agent that sends them."""

import os
import sys
import time
from pathlib import Path

from gpufleet.backends import files_back
from gpufleet.backends.node_agent import NodeAgent

RECORD = "torchrun/r_x/attempt_0/1/error.json"


def test_a_framed_file_comes_back_whole_and_a_log_line_is_not_one() -> None:
    data = bytes(range(256)) * 3 + b"\n\nend"
    line = files_back.frame(RECORD, data)
    assert "\n" not in line
    assert files_back.unframe(line) == (RECORD, data)
    assert files_back.unframe("[rank0]: hello") is None
    assert files_back.unframe(files_back.FRAME + "{not json") is None
    for outside in ("../../etc/passwd", "/etc/passwd", "torchrun/../../x", ""):
        assert files_back.unframe(files_back.frame(outside, b"x")) is None


def test_this_runs_files_under_torchrun_are_framed_and_written_back(tmp_path: Path) -> None:
    node, here = tmp_path / "node" / "job", tmp_path / "here" / "job"
    (node / "torchrun" / "r_x" / "attempt_0" / "1").mkdir(parents=True)
    (node / RECORD).write_text('{"message": {"message": "ValueError: bad"}}')
    big = node / "torchrun" / "r_x" / "attempt_0" / "1" / "stderr.log"
    big.write_bytes(b"a" * files_back.MAX_FILE_BYTES + b"THE END")
    old = node / "torchrun" / "r_old" / "attempt_0" / "0" / "error.json"
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    os.utime(old, (1000.0, 1000.0))  # an earlier run's, left on the node
    (node / "checkpoint.pt").write_bytes(b"c")  # not under torchrun/: not sent
    (node / "torchrun" / "link").symlink_to("/etc/hostname")

    lines = files_back.framed(node, since=2000.0)
    assert [files_back.unframe(ln)[0] for ln in lines if files_back.unframe(ln)] == [
        RECORD, "torchrun/r_x/attempt_0/1/stderr.log"]
    for ln in lines:
        assert files_back.write_back(here, ln)
    assert not files_back.write_back(here, "[rank1]: a log line")
    assert (here / RECORD).read_text() == '{"message": {"message": "ValueError: bad"}}'
    tail = (here / "torchrun" / "r_x" / "attempt_0" / "1" / "stderr.log").read_bytes()
    assert len(tail) == files_back.MAX_FILE_BYTES and tail.endswith(b"THE END")
    assert sorted(p.name for p in here.rglob("*") if p.is_file()) == ["error.json", "stderr.log"]
    assert len(files_back.framed(node)) == 3  # since 0: the old record too


_SCRIPT = """
import pathlib, sys
d = pathlib.Path(sys.argv[1]) / "torchrun" / "r_y" / "attempt_0" / "0"
d.mkdir(parents=True)
(d / "error.json").write_text('{"rank": 0}')
print("last line", flush=True)
sys.exit(3)
"""


def _until_ended(agent: NodeAgent) -> tuple[list[str], int]:
    out: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines, code = agent.drain()
        out += lines
        if code is not None:
            return out, code
        time.sleep(0.05)
    raise AssertionError(f"the agent's process did not end; lines so far: {out}")


def test_the_agent_sends_the_files_back_after_the_last_line_once(tmp_path: Path) -> None:
    """A real process under the node agent (keeper and all), as a Slurm step or Ray actor runs
    it; only an agent told `files_back` sends anything."""
    sampling = {"devices": [], "key_base": 0, "on_cpu": True, "threads": 1,
                "memory_per_slot": 0}
    for told in (True, False):
        job = tmp_path / ("unseen" if told else "seen")
        job.mkdir()
        agent = NodeAgent("n2", "127.0.0.1:9")
        agent.start([sys.executable, "-c", _SCRIPT, str(job)], {}, str(tmp_path), sampling,
                    str(job) if told else None)
        lines, code = _until_ended(agent)
        assert code == 3
        framed = [files_back.unframe(ln) for ln in lines]
        if told:
            assert lines[0] == "last line" and framed[1:] == [
                ("torchrun/r_y/attempt_0/0/error.json", b'{"rank": 0}')]
            assert framed[0] is None
        else:
            assert lines == ["last line"]
        assert agent.drain() == ([], 3)  # sent once


def test_a_node_without_the_submitters_files_runs_its_own_bootstrap() -> None:
    from gpufleet.backends.node_agent import own_site

    mine, theirs = "/srv/env/gpufleet/bootstrap/site", "/home/ann/src/gpufleet/bootstrap/site"
    assert own_site(f"{theirs}:/home/ann/proj", mine, lambda p: False) == f"{mine}:/home/ann/proj"
    assert own_site(f"{theirs}:/x", mine, lambda p: p == theirs) == f"{theirs}:/x"  # shared
    assert own_site("/a/site:/b", mine, lambda p: False) == "/a/site:/b"
