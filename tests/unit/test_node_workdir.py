"""A node's side of the workdir (backends/node_workdir.py), with real setup processes: placed
once per digest, set up once per node per digest (also when two jobs come at once), a failed
setup is the run's reason and is tried again next time, and the last job out removes it all."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.backends.node_workdir import (
    SetupFailed,
    WorkdirMissing,
    has,
    place,
    remove,
    setup_marker,
)
from gpufleet.launch.workdir import Selection, select, write_tar


def _shipped(tmp_path: Path) -> tuple[Selection, bytes]:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "m.py").write_text("X = 1\n")
    sel = select(src)
    buf = io.BytesIO()
    write_tar(sel, buf)
    return sel, buf.getvalue()


# setup counts its own runs in a file outside the cache, so a rerun cannot hide
def _setup(count: Path) -> str:
    return f"echo run >> {count}; echo installing; ls pkg"


def test_placed_and_set_up_once(tmp_path: Path) -> None:
    sel, tar = _shipped(tmp_path)
    cache, count, said = tmp_path / "cache", tmp_path / "count", []
    folder = place(cache, sel.digest, io.BytesIO(tar), _setup(count), said.append, node="n1",
                   user="job-a")
    assert folder == cache / sel.digest and (folder / "pkg" / "m.py").read_text() == "X = 1\n"
    assert said == ["installing", "m.py"] and count.read_text() == "run\n"
    assert setup_marker(cache, sel.digest, _setup(count)).exists() and has(cache, sel.digest)
    # again, as the next job would: nothing sent, nothing run
    said.clear()
    assert place(cache, sel.digest, None, _setup(count), said.append, user="job-b") == folder
    assert said == [] and count.read_text() == "run\n"
    # another setup command for the same workdir runs once too
    place(cache, sel.digest, None, "echo other", said.append)
    assert said == ["other"]


def test_not_sent_and_not_there(tmp_path: Path) -> None:
    with pytest.raises(WorkdirMissing, match="was not sent"):
        place(tmp_path / "cache", "a" * 64, None, "", print, node="n2")
    with pytest.raises(ValueError, match="not a workdir digest"):
        place(tmp_path / "cache", "../etc", None, "", print)


def test_failed_setup_is_the_reason_and_is_tried_again(tmp_path: Path) -> None:
    sel, tar = _shipped(tmp_path)
    cache, count = tmp_path / "cache", tmp_path / "count"
    failing = f"echo run >> {count}; echo collecting; echo 'No matching distribution' >&2; exit 3"
    with pytest.raises(SetupFailed) as err:
        place(cache, sel.digest, io.BytesIO(tar), failing, lambda _: None, node="worker1")
    assert str(err.value) == ("setup failed on worker1 (exit 3): collecting | "
                              "No matching distribution")
    assert not setup_marker(cache, sel.digest, failing).exists()
    with pytest.raises(SetupFailed):
        place(cache, sel.digest, None, failing, lambda _: None, node="worker1")
    assert count.read_text() == "run\nrun\n"


_PLACE = """
import io, json, sys
from pathlib import Path
from gpufleet.backends.node_workdir import place
a = json.loads(sys.argv[1])
tar = open(a["tar"], "rb")
said = []
place(Path(a["cache"]), a["digest"], tar, a["setup"], said.append, user=a["user"])
print(json.dumps(said))
"""


def test_two_jobs_at_once_set_up_once(tmp_path: Path) -> None:
    """The first job's setup waits for a file this test makes only after the second job has
    started; the second waits on the lock, so setup runs once and both get the copy."""
    sel, tar = _shipped(tmp_path)
    (tmp_path / "w.tar.gz").write_bytes(tar)
    go, started, count = tmp_path / "go", tmp_path / "started", tmp_path / "count"
    setup = (f"echo run >> {count}; touch {started}; "
             f"while [ ! -e {go} ]; do sleep 0.05; done; echo done")

    def job(user: str) -> subprocess.Popen[str]:
        arg = json.dumps({"tar": str(tmp_path / "w.tar.gz"), "cache": str(tmp_path / "cache"),
                          "digest": sel.digest, "setup": setup, "user": user})
        return subprocess.Popen([sys.executable, "-c", _PLACE, arg], stdout=subprocess.PIPE,
                                text=True)

    first = job("a")
    for _ in range(1200):  # up to 120 s for the first job's setup to begin
        if started.exists():
            break
        subprocess.run(["sleep", "0.1"], check=True)
    assert started.exists()
    second = job("b")
    go.touch()
    out_a, _ = first.communicate(timeout=120)
    out_b, _ = second.communicate(timeout=120)
    assert (first.returncode, second.returncode) == (0, 0)
    assert json.loads(out_a) == ["done"] and json.loads(out_b) == []
    assert count.read_text() == "run\n"


def test_last_job_out_removes_everything(tmp_path: Path) -> None:
    sel, tar = _shipped(tmp_path)
    cache = tmp_path / "cache"
    place(cache, sel.digest, io.BytesIO(tar), "true", print, user="job-a")
    place(cache, sel.digest, None, "true", print, user="job-b")
    assert not remove(cache, sel.digest, "job-a")
    assert has(cache, sel.digest)
    assert remove(cache, sel.digest, "job-b")
    assert list(cache.iterdir()) == []
