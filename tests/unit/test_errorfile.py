"""bootstrap.errorfile: a real interpreter that installs the hook and raises writes torchrun's
error file, still prints its traceback, and leaves a file that torch's `@record` wrote alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.supervise.blame import parse

SRC = Path(__file__).resolve().parents[2] / "src"

RAISES = """
import sys
from gpufleet.bootstrap import errorfile
errorfile.install()
errorfile.install()  # twice: still one hook, one file
assert "torch" not in sys.modules, "the hook must not import torch"
def step(n):
    raise RuntimeError(f"boom at step {n}")
step(3)
"""


def _run(code: str, error_file: Path | None, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_ERROR_FILE"}
    full.update(env, PYTHONPATH=str(SRC))
    if error_file is not None:
        full["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=60)


def test_an_uncaught_exception_is_written_in_torchs_layout_and_still_printed(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    before = time.time_ns()
    r = _run(RAISES, path, RANK="3")
    assert r.returncode == 1
    assert "Traceback (most recent call last)" in r.stderr and "boom at step 3" in r.stderr
    data = json.loads(path.read_text())
    message = data["message"]
    assert message["message"] == "RuntimeError: boom at step 3"
    extra = message["extraInfo"]
    assert "Traceback (most recent call last)" in extra["py_callstack"]
    assert "in step" in extra["py_callstack"]  # the frame that raised
    assert extra["py_callstack"].rstrip().endswith("RuntimeError: boom at step 3")
    assert before // 10**9 <= int(extra["timestamp"]) <= time.time()  # torch's whole seconds
    assert before <= int(extra["time_ns"]) <= time.time_ns()
    assert (extra["exception_type"], extra["exception_message"]) == ("RuntimeError", "boom at step 3")
    assert extra["rank"] == "3"
    record = parse(data, None)
    assert record is not None and (record.rank, record.kind) == (3, "RuntimeError")


def test_torch_reads_the_file_as_its_own(tmp_path: Path) -> None:
    """torch's ProcessFailure (what torchrun's summary is made of) takes message and time."""
    path = tmp_path / "error.json"
    _run(RAISES, path, RANK="0")
    read = ("from torch.distributed.elastic.multiprocessing.errors import ProcessFailure\n"
            f"f = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file={str(path)!r})\n"
            "print(f.message['message'], f.timestamp)")
    r = _run(read, None)
    assert r.returncode == 0, r.stderr
    text, stamp = r.stdout.strip().rsplit(" ", 1)
    assert text == "RuntimeError: boom at step 3" and abs(int(stamp) - time.time()) < 60


def test_a_file_written_by_torchs_record_wins(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {"message": "ValueError: from @record",
                                            "extraInfo": {"py_callstack": "x", "timestamp": "1"}}}))
    r = _run(RAISES, path, RANK="0")
    assert r.returncode == 1 and "boom at step 3" in r.stderr
    assert json.loads(path.read_text())["message"]["message"] == "ValueError: from @record"


def test_a_script_that_uses_torchs_record_keeps_its_record(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    code = ("from gpufleet.bootstrap import errorfile\nerrorfile.install()\n"
            "from torch.distributed.elastic.multiprocessing.errors import record\n"
            "@record\ndef main():\n    raise KeyError('k')\nmain()\n")
    r = _run(code, path, RANK="0")
    assert r.returncode == 1
    extra = json.loads(path.read_text())["message"]["extraInfo"]
    assert "time_ns" not in extra  # torch's own file, not ours
    assert json.loads(path.read_text())["message"]["message"] == "KeyError: 'k'"


def test_no_error_file_variable_no_hook_and_no_file(tmp_path: Path) -> None:
    r = _run("import sys\nfrom gpufleet.bootstrap import errorfile\nerrorfile.install()\n"
             "print(getattr(sys.excepthook, 'gpufleet_error_file', False))", None)
    assert r.stdout.strip() == "False"
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_error_file_still_prints_the_traceback(tmp_path: Path) -> None:
    r = _run(RAISES, tmp_path / "missing-folder" / "error.json", RANK="0")
    assert r.returncode == 1
    assert "boom at step 3" in r.stderr and "no error file written" in r.stderr
