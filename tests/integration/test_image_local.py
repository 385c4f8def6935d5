"""Jobs in a container image on the local pool, with real podman and the test image
(scripts/test-image: a Debian Python with torch and no gpufleet; the bootstrap and the SDK come
mounted from this checkout).

What a user would check: the example GPT trains in the image and shows its progress, loss,
layout and cost as without one, its workers really ran inside (the image's interpreter, not this
checkout's), a cluster's image applies to the jobs run on it, a killed supervisor leaves no
container, and a bad image or runtime option is one line with exit 2 and nothing reserved.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from fleet_helpers import EXAMPLES, WORKERS, Fleet, error_lines
from images import image_or_skip

NAPPER = str(WORKERS / "napper.py")
GONE_WITHIN_S = 60.0  # keeper: SIGTERM through podman, 5 s grace, SIGKILL, then `podman rm -f`

def containers(job: str) -> list[str]:
    """The job's containers on this host, running or not, by gpufleet's label."""
    done = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}} {{.Status}}",
                           "--filter", f"label=gpufleet.job={job}"],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.split("\n")[:-1]

def ranks_of(script: str) -> list[psutil.Process]:
    """The worker processes of `script`: plain ones by their command line (not a launcher's),
    warm ones (forked from the forkserver: docs/warm.md) by the name each gives its process,
    below the launcher."""
    from gpufleet.launch.warm_rank import rank_in_name

    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if script not in cmd:
            continue
        with contextlib.suppress(psutil.Error):
            if "gpufleet.launch.warm" in cmd:
                found.update({c.pid: c for c in p.children(recursive=True)
                              if rank_in_name(c.name(), "RANK") is not None})
            elif "torch.distributed.run" not in cmd:
                found[p.pid] = p
    return list(found.values())


def wait_until(what: str, done: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(done) and done():
            return
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")

def test_the_gpt_trains_in_a_clusters_image_as_without_one(fleet: Fleet) -> None:
    image = image_or_skip()
    fleet.ok("launch", "--gpu", "cpu", "--count", "2", "--name", "dev", "--image", image, "-y")
    done = fleet("run", "--cluster", "dev", "--name", "gpt", str(EXAMPLES / "gpt.py"),
                 "--", "--steps", "20", timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr
    s = fleet.status("gpt")
    assert s["status"] == "succeeded" and s["step"] == 20
    assert s["image"] == image  # the cluster's image, written into the job at submission
    assert s["loss"] < s["first_loss"] and s["samples_per_s"] > 0 and s["cost_usd"] > 0
    assert s["layout"].startswith("ddp, dp=2") and "applied by gpufleet" in s["layout"]
    log = fleet.ok("logs", "gpt").stdout
    assert f"local: launcher in image {image} (podman, /usr/bin/python3, container " in log
    assert "2 ranks joined over gloo" in log
    assert containers("gpt") == []  # removed with the run

def test_a_killed_supervisor_leaves_no_container(fleet: Fleet) -> None:
    image = image_or_skip()
    fleet.ok("run", "--gpu", "cpu", "--count", "2", "--name", "nap", "--image", image, "-y",
             "-d", "--bootstrap", NAPPER)
    fleet.wait_for_step("nap", 3, timeout=240)
    assert [c.split()[1] for c in containers("nap")] == ["Up"]
    with contextlib.closing(sqlite3.connect(f"file:{fleet.home / 'state.db'}?mode=ro",
                                            uri=True)) as db:
        (pid,), = db.execute("select supervisor_pid from jobs where name = 'nap'").fetchall()
    workers = ranks_of(NAPPER)
    assert len(workers) == 2, workers
    # the workers are the image's interpreter (host pids: --pid host), not this checkout's
    assert {w.cmdline()[0] for w in workers} == {"/usr/bin/python3"}
    psutil.Process(pid).send_signal(signal.SIGKILL)
    wait_until("the job's container removed after its supervisor was killed",
               lambda: containers("nap") == [], GONE_WITHIN_S)
    _gone, alive = psutil.wait_procs(workers, timeout=GONE_WITHIN_S)
    assert not alive, f"workers left: {alive}"
    assert fleet.status("nap")["status"] == "interrupted"
    assert fleet.clusters() == []

def test_a_stopped_job_slow_to_end_leaves_no_container(fleet: Fleet) -> None:
    """Its workers outlast the stop's grace (a checkpoint saved on SIGTERM): they are killed,
    and the keeper, which is not, still removes the container (it was killed with them)."""
    image = image_or_skip()
    fleet.ok("run", "--gpu", "cpu", "--count", "2", "--name", "slowend", "--image", image, "-y",
             "-d", "--bootstrap", NAPPER, "--", "--slow-term", "600")
    fleet.wait_for_step("slowend", 3, timeout=240)
    assert [c.split()[1] for c in containers("slowend")] == ["Up"]
    fleet.ok("stop", "slowend")
    wait_until("the job's container removed after a stop that outlasted its grace",
               lambda: containers("slowend") == [], GONE_WITHIN_S)
    assert fleet.status("slowend")["status"] == "stopped"
    assert "napper: SIGTERM, ending in 600 s" in fleet.ok("logs", "slowend").stdout

@pytest.mark.parametrize(("flags", "field", "words"), [
    (["--image", "localhost/none-such:0", "--pull", "never"], "image",
     "image localhost/none-such:0 is not on local"),
    (["--container-opt", "--network=bridge"], "container_opts", "--network is set by gpufleet"),
    (["--shm-size", "64m"], "shm_size", "is below 1g"),
    (["--pull", "sometimes"], "pull", "never"),
])
def test_a_bad_image_or_option_is_one_line_with_nothing_reserved(
        fleet: Fleet, flags: list[str], field: str, words: str) -> None:
    image = image_or_skip()
    given = flags if flags[0] == "--image" else ["--image", image, *flags]
    done = fleet("run", "--gpu", "cpu", "--count", "2", "--name", "bad", "-y", *given,
                 str(EXAMPLES / "gpt.py"))
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = error_lines(done.stderr)
    assert field in line and words in line, line
    assert "Traceback" not in done.stderr
    assert fleet.clusters(all_=True) == []  # no cluster made, none left stopped either
    assert containers("bad") == []

def test_an_absolute_script_outside_the_workdir_is_mounted(fleet: Fleet, tmp_path: Path) -> None:
    image = image_or_skip()
    elsewhere = tmp_path / "recipes"
    elsewhere.mkdir()
    script = elsewhere / "hello.py"
    script.write_text("import os, sys, torch\n"
                      "print('inside', sys.executable, torch.__version__, os.getcwd(), flush=True)\n")
    done = fleet("run", "--gpu", "cpu", "--count", "1", "--name", "hello", "--image", image,
                 "-y", str(script), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    log = fleet.ok("logs", "hello").stdout
    assert f"inside /usr/bin/python3 2.13.0+cpu {fleet.cwd}" in log
