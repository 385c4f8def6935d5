"""Shared or not, detected (backends/shipping.py), the checkpoint rule where nodes do not share
(lifecycle/admission.py), the job's new fields, and Slurm's probe step run by a real shell."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpufleet.backends import shipping
from gpufleet.backends import slurm_cmds as cmds
from gpufleet.errors import SpecError
from gpufleet.launch.workdir import DEFAULT_MAX_UPLOAD
from gpufleet.lifecycle.admission import Facts, Refused, Target, admit
from gpufleet.spec import JobSpec


class _Engine:
    """Nodes in `mounted` read this machine's files: each answers by reading the path."""

    def __init__(self, mounted: set[str]):
        self.mounted = mounted
        self.asked: list[tuple[list[str], str]] = []

    def sees(self, node_ids: Sequence[str], path: Path, content: str,
             ref: str = "") -> dict[str, bool]:
        self.asked.append((list(node_ids), ref))
        return {n: n in self.mounted and path.read_text() == content for n in node_ids
                if n != "silent"}


def test_probe_ships_iff_some_node_does_not_see(tmp_path: Path) -> None:
    shared = shipping.probe(_Engine({"n1", "n2"}), ["n1", "n2"], tmp_path, ref="7")
    assert shared is not None and not shared.ships and shared.unseen == ()
    apart = shipping.probe(_Engine({"n1"}), ["n1", "n2"], tmp_path)
    assert apart is not None and apart.ships and apart.unseen == ("n2",)
    # a node that did not answer cannot be relied on to read the job's files
    quiet = shipping.probe(_Engine({"n1", "silent"}), ["n1", "silent"], tmp_path)
    assert quiet is not None and quiet.unseen == ("silent",)
    assert list(tmp_path.iterdir()) == []  # the probe file is removed
    assert shipping.probe(object(), ["n1"], tmp_path) is None  # an engine of this host only


def test_probe_content_is_fresh_each_time(tmp_path: Path) -> None:
    """A stale probe file left where a node looks cannot pass for this one."""
    seen: list[str] = []

    class Recorder:
        def sees(self, node_ids: Sequence[str], path: Path, content: str,
                 ref: str = "") -> dict[str, bool]:
            seen.append(content)
            return {}

    shipping.probe(Recorder(), ["n1"], tmp_path)
    shipping.probe(Recorder(), ["n1"], tmp_path)
    assert len(set(seen)) == 2 and all(len(c) == 32 for c in seen)


def _target() -> Target:
    return Target("big", "cpu", 4, 2, "slurm")


def _decide(unseen: tuple[str, ...], resuming: bool = False, **fields: object) -> Refused | None:
    spec = JobSpec.parse({"script": "train.py", "name": "j", "cluster": "big", **fields})
    got = admit(spec, _target(), Facts(unseen=unseen, resuming=resuming))
    return got if isinstance(got, Refused) else None


def test_restarts_where_nodes_do_not_share_need_a_durable_copy() -> None:
    refused = _decide(("n2",), max_restarts=2)
    assert refused is not None and isinstance(refused.error, SpecError)
    text = str(refused.error)
    assert text.startswith("checkpoint_to: node(s) n2 of cluster big do not see")
    assert "--max-restarts 2" in text and "--checkpoint-to URL" in text and "\n" not in text
    resumed = _decide(("n1", "n2"), resuming=True)
    assert resumed is not None and "n1, n2" in str(resumed.error) and "--resume" in str(resumed.error)


@pytest.mark.parametrize(("unseen", "fields"), [
    ((), {"max_restarts": 2}),  # every node sees the files: checkpoints are shared
    (("n2",), {}),  # no restart, no resume: nothing reads a checkpoint back
    (("n2",), {"max_restarts": 2, "checkpoint_to": "s3://bucket/ckpt"}),
])
def test_admitted_when_no_checkpoint_is_read_back_from_a_node(unseen: tuple[str, ...],
                                                               fields: dict[str, object]) -> None:
    assert _decide(unseen, **fields) is None


def test_the_job_fields_that_travel() -> None:
    spec = JobSpec.parse({"script": "t.py", "setup": "pip install -r requirements.txt",
                          "max_upload": "1GB", "keep_workdir": True})
    assert spec.setup == "pip install -r requirements.txt" and spec.keep_workdir
    assert spec.max_upload_bytes == 2**30
    assert JobSpec.parse({"script": "t.py"}).max_upload_bytes == DEFAULT_MAX_UPLOAD
    with pytest.raises(SpecError) as err:
        JobSpec.parse({"script": "t.py", "max_upload": "512KB", "setup": "  "})
    fields = dict(err.value.problems)
    assert "below 1 MB" in fields["max_upload"] and "empty setup" in fields["setup"]
    with pytest.raises(SpecError, match="max_upload: 'lots' is not a size"):
        JobSpec.parse({"script": "t.py", "max_upload": "lots"})


def test_slurm_probe_step_each_node_says_what_it_reads(tmp_path: Path) -> None:
    """The step's command after srun's own options, run by a real shell as each node would."""
    probe = tmp_path / "a probe"
    probe.write_text("c0ffee")
    argv = cmds.sees_step("12", ["n1", "n2"], str(probe))
    assert argv[:9] == ["srun", "--jobid=12", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--nodelist=n1,n2", "--overlap", "--quiet", "--job-name=gpufleet-probe"]
    step = argv[9:]
    out = ""
    for node, path in (("n1", probe), ("n2", tmp_path / "missing")):
        out += subprocess.run([*step[:-1], str(path)], capture_output=True, text=True, check=True,
                              env={**os.environ, "SLURMD_NODENAME": node}).stdout
    assert cmds.seen_by(out + "srun: some noise\n", "c0ffee") == {"n1": True, "n2": False}


def test_run_refuses_a_bad_max_upload_with_one_line(tmp_path: Path) -> None:
    """The real command, as a user types it: one line, exit 2, no job made (one case: a
    command's start costs seconds here; the others are the spec's, above)."""
    import sys

    (tmp_path / "t.py").write_text("print(1)\n")
    home = tmp_path / "home"
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "run", "t.py", "--cluster", "c",
                        "--max-upload", "lots"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "GPUFLEET_HOME": str(home)}, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "error: max_upload: 'lots' is not a size (examples: 100MB, 1GB, 500KiB)"]
    assert not (home / "jobs").exists() or list((home / "jobs").iterdir()) == []
