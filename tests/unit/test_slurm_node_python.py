"""A Slurm pool's nodes' interpreter (`pool add slurm --python`): what each node's step runs,
and what `pool add` accepts. Nodes that share nothing with this machine do not have its
interpreter at its path, so the step names the pool's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpufleet.backends import adders
from gpufleet.backends import slurm_cmds as cmds
from gpufleet.backends.slurm import SlurmBackend
from gpufleet.backends.slurm_run import node_argv
from gpufleet.errors import SpecError


def test_each_nodes_step_runs_the_pools_python_else_this_machines() -> None:
    plan = Path("/tmp/gpufleet-plan-x.json")
    assert node_argv(1, plan, "/srv/machine/env/bin/python") == [
        "/srv/machine/env/bin/python", "-m", "gpufleet.backends.slurm_run", "--node", "1",
        str(plan)]
    assert node_argv(0, plan)[0] == sys.executable  # nodes that share this machine's files
    assert node_argv(0, plan, None)[0] == sys.executable


def test_the_dry_run_shows_the_nodes_python_in_every_step(tmp_path: Path) -> None:
    backend = SlurmBackend("lab", "gpu", None, None, "python3")
    lines = backend.dry_run(None, "41", ["n1", "n2"], tmp_path)
    assert len(lines) == 2
    for i, (line, node) in enumerate(zip(lines, ("n1", "n2"), strict=True)):
        assert line.startswith(cmds.line(cmds.srun("41", node, [])))
        assert line.endswith(f"python3 -m gpufleet.backends.slurm_run --node {i} "
                             f"{tmp_path / 'slurm-plan.json'}")


@pytest.mark.parametrize("given", ["", "  ", " /opt/py", "/opt/py\n"])
def test_a_blank_or_padded_python_is_refused_naming_the_field(given: str) -> None:
    with pytest.raises(SpecError) as caught:
        adders.check_python(given)
    assert caught.value.problems[0][0] == "python"


def test_a_python_is_kept_as_given_and_only_a_slurm_pool_takes_one(tmp_path: Path) -> None:
    assert adders.check_python("/srv/machine/env/bin/python") == "/srv/machine/env/bin/python"
    assert adders.check_python("python3") == "python3"
    assert adders.check_python(None) is None
    claimed: list[str] = []
    r = adders.AddRequest("s", None, ["1xH100:1"], None, None, None, tmp_path,
                          lambda: claimed.append("s"), ssh=adders.HostsAsk(python="/opt/py"))
    with pytest.raises(SpecError) as caught:
        adders.add_sim(r)
    assert caught.value.problems[0][0] == "python" and "Slurm" in caught.value.problems[0][1]
    assert claimed == []  # refused before the name was taken


def test_a_step_on_a_node_without_this_folder_starts_at_the_root() -> None:
    step = cmds.srun("7", "n2", ["/opt/py", "-m", "x"], chdir="/")
    assert "--chdir=/" in step and step[-3:] == ["/opt/py", "-m", "x"]
    assert not any(a.startswith("--chdir") for a in cmds.srun("7", "n2", ["py"]))
