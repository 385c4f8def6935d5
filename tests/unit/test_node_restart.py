"""Restarts in place on a run of several nodes (backends/node_restart.py and the watch in
node_driver.py), against an engine whose polls are a script: one `PARKED` line for the
supervisor only once every node waits, the supervisor's decision carried to every node, and a
node that does not wait with the others ending the run as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.backends import node_driver
from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.backends.node_agent import OWN_DIR, NodeAgent, let_go, restart_file_of
from gpufleet.backends.node_driver import NodeDriver
from gpufleet.backends.node_restart import Parks, order_line, parse_order, waiting_line
from gpufleet.launch import warm_restart
from gpufleet.launch.warm_restart import RESTART_FILE_VAR, Decision, parked_code, parked_line

PLAN = {"nodes": [{"name": "head", "node_id": "n1", "env": {"GPUFLEET_RUN": "1"}},
                  {"name": "worker1", "node_id": "n2", "env": {"GPUFLEET_RUN": "1"}}]}
Step = tuple[dict[int, int], set[str], list[int]]  # ended, lost, nodes whose launcher parks now


class Scripted(NodeDriver):
    """Each poll is the next step of the script (the last one repeats); a step's parking nodes
    print their launcher's line, as an engine's drain would. `decide(driver)`, when set, is the
    supervisor: called once the run's `PARKED` line is out."""

    def __init__(self, steps: list[Step], tmp: Path, lost: set[str] | None = None):
        super().__init__(PLAN, tmp / "p.lost")
        self.steps, self.confirmed = steps, lost or set()
        self.relayed: list[str] = []
        self.ended: list[float] = []
        self.out: list[str] = []

    def place(self) -> int | None:
        return None

    def poll(self) -> tuple[dict[int, int], set[str]]:
        ended, lost, parking = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        for i in parking:
            self.out.append(self.parks.saw(i, parked_line(1, self.run_no)))
        return ended, lost

    def confirm_lost(self) -> tuple[set[str], str]:
        return self.confirmed, "gone"

    def lost_text(self, lost: set[str], how: str) -> str:
        return f"lost {self.named(lost)}"

    def relay(self, line: str) -> None:
        self.relayed.append(line)

    def end_all(self, grace_s: float) -> None:
        self.ended.append(grace_s)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_driver.time, "sleep", lambda _s: None)


def decisions(tmp: Path, monkeypatch: pytest.MonkeyPatch, *found: Decision | None) -> list[int]:
    """The supervisor's file as the driver reads it: None (no decision yet), then each of
    `found` in turn (the last repeats). Returns the list of reads so far, to count them."""
    reads: list[int] = []
    seq = list(found)

    def read(_path: Path) -> Decision | None:
        reads.append(1)
        return seq.pop(0) if len(seq) > 1 else seq[0]

    monkeypatch.setenv(RESTART_FILE_VAR, str(tmp / "restart.json"))
    monkeypatch.setattr(node_driver.warm_restart, "read", read)
    return reads


def parked_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if parked_code(ln) is not None]


def test_one_parked_line_once_every_node_waits_then_the_restart_goes_to_every_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    decisions(tmp_path, monkeypatch, None, None, Decision(2, {"GPUFLEET_RUN": "2"}))
    steps: list[Step] = [({}, set(), []), ({}, set(), [1]), ({}, set(), []), ({}, set(), [0]),
                         ({}, set(), []), ({0: 0, 1: 0}, set(), [])]
    d = Scripted(steps, tmp_path)
    d.decisions = str(tmp_path / "restart.json")
    assert d.run() == 0
    out = capsys.readouterr().out
    assert parked_lines(out) == [parked_line(1, 1)]  # the run's, once, not each node's
    assert all(parked_code(ln) is None for ln in d.out)  # the nodes' lines are their own news
    assert d.relayed == [order_line(Decision(2, {"GPUFLEET_RUN": "2"}), False)]
    assert d.run_no == 2 and d.ended == [] and not d.parks.waiting


def test_the_supervisors_end_goes_to_every_node_and_is_the_drivers_exit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    decisions(tmp_path, monkeypatch, Decision(0, {}, end=1))
    d = Scripted([({}, set(), [0, 1]), ({}, set(), []), ({0: 1, 1: 1}, set(), [])], tmp_path)
    d.decisions = str(tmp_path / "restart.json")
    assert d.run() == 1
    assert d.relayed == ["end 1"] and d.ended == [5.0] and not d.over


def test_an_end_that_ends_the_job_says_so_to_every_node_and_the_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop in a backoff, or a job given up before its last restart: the nodes and the
    spares let the job's copies go (ssh_node, ssh_run/ray_run), though the run was not the
    last the job could have had."""
    decisions(tmp_path, monkeypatch, Decision(0, {}, end=1, over=True))
    d = Scripted([({}, set(), [0, 1]), ({}, set(), []), ({0: 1, 1: 1}, set(), [])], tmp_path)
    d.decisions = str(tmp_path / "restart.json")
    assert d.run() == 1
    assert d.relayed == ["end 1 over"] and d.over


def test_a_decision_for_the_run_the_nodes_are_on_is_not_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file left from the run before (the nodes are on run 1) is not this run's decision."""
    reads = decisions(tmp_path, monkeypatch, Decision(1, {}), Decision(1, {}), Decision(1, {}),
                      Decision(0, {}, end=4))
    d = Scripted([({}, set(), [0, 1]), ({}, set(), [])], tmp_path)
    d.decisions = str(tmp_path / "restart.json")
    assert d.run() == 4 and len(reads) == 4 and d.relayed == ["end 4"]


def test_a_node_whose_launcher_ends_instead_of_waiting_ends_the_run_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The waiting launchers are told to end (as plain torchrun, quietly, their nodes' clean-up
    run) before what is left is ended."""
    decisions(tmp_path, monkeypatch, None)
    d = Scripted([({}, set(), [1]), ({0: 1}, set(), []), ({0: 1, 1: 1}, set(), [])], tmp_path)
    assert d.run() == 1
    out = capsys.readouterr().out
    assert parked_lines(out) == [] and d.relayed == ["end 1"] and d.ended == [10.0]
    assert ("the launcher on head did not wait with the others within 5 s: ending every node; "
            "the next run starts new launchers") in out


def test_nodes_that_do_not_all_wait_within_the_grace_end_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000))
    monkeypatch.setattr(node_driver.time, "monotonic", lambda: float(next(clock)))
    decisions(tmp_path, monkeypatch, None)
    d = Scripted([({}, set(), [0]), ({}, set(), [])], tmp_path)
    assert d.run() == 1 and d.relayed == ["end 1"] and d.ended == [10.0]
    assert next(clock) <= 2 * node_driver.PEERS_END_S + 5  # both waits were bounded


def test_a_node_lost_while_the_run_waits_is_a_lost_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    decisions(tmp_path, monkeypatch, None)
    d = Scripted([({}, set(), [0, 1]), ({}, set(), []), ({1: 255}, set(), [])], tmp_path,
                 lost={"n2"})
    d.decisions = str(tmp_path / "restart.json")
    assert d.run() == NODE_LOST_EXIT and d.relayed == ["end 1"]
    assert (tmp_path / "p.lost").read_text() == '["n2"]'


def test_a_lost_node_is_not_looked_for_while_the_others_come_to_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's look for a lost node asks the live steps to end: a node that parks first must
    not end the run its peers are about to wait in."""
    decisions(tmp_path, monkeypatch, Decision(2, {}))
    d = Scripted([({}, set(), [1]), ({}, set(), [0]), ({0: 0, 1: 0}, set(), [])], tmp_path,
                 lost={"n1"})
    d.decisions = str(tmp_path / "restart.json")
    assert d.run() == 0 and d.relayed == [order_line(Decision(2, {}), False)]


def test_a_stop_while_the_run_waits_ends_every_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    decisions(tmp_path, monkeypatch, None)
    d = Scripted([({}, set(), [0, 1]), ({}, set(), [])], tmp_path)
    d.decisions = str(tmp_path / "restart.json")
    real = d.poll
    calls = [0]

    def poll() -> tuple[dict[int, int], set[str]]:
        calls[0] += 1
        if calls[0] == 3:
            d.stop_asked = True
        return real()

    d.poll = poll  # type: ignore[method-assign]
    assert d.run() == 143 and d.relayed == [] and d.ended == [10.0]


def test_orders_read_back_as_written() -> None:
    restart = Decision(3, {"GPUFLEET_RUN": "3", "X": "a b=c"})
    assert parse_order(order_line(restart, True)) == (restart, True)
    assert parse_order(order_line(Decision(0, {}, end=-9), False)) == (Decision(0, {}, end=-9),
                                                                      False)
    assert parse_order(order_line(Decision(0, {}, end=1, over=True), False)) == (
        Decision(0, {}, end=1, over=True), True)
    for other in ("ping", "stop", "stop job", "restart {", "end x", "restart []", "end 1 x",
                  "end over"):
        assert parse_order(other) is None


def test_a_nodes_parked_line_becomes_its_own_news() -> None:
    parks = Parks(2)
    assert parks.saw(0, "[rank0]: hello") == "[rank0]: hello" and parks.first() is None
    line = parks.saw(1, parked_line(1, 4))
    assert line == waiting_line(1, 4) and parked_code(line) is None
    assert parks.first() == (1, 1, 4) and not parks.all()
    parks.saw(0, parked_line(1, 4))
    assert parks.all()
    parks.clear()
    assert parks.first() is None


def test_the_agent_writes_the_decision_where_its_launcher_reads_it(tmp_path: Path) -> None:
    """The node's file is in the job folder as the node has it (an image mounts that folder),
    named by the node (nodes may share the folder)."""
    env = {"GPUFLEET_JOB_DIR": str(tmp_path), RESTART_FILE_VAR: "node"}
    path = restart_file_of(env, "m/1")
    assert path == tmp_path / "restart-m_1.json" == restart_file_of(env, "m/1", in_image=True)
    agent = NodeAgent("m/1", "127.0.0.1:1")
    assert not agent.decide("restart {}")  # no launcher of its own waits
    agent.restart_file = path
    assert agent.decide(order_line(Decision(2, {"GPUFLEET_RUN": "2"}), False))
    assert warm_restart.read(path) == Decision(2, {"GPUFLEET_RUN": "2"})
    assert warm_restart.rank_env({RESTART_FILE_VAR: str(path), "GPUFLEET_RUN": "1"}) == \
        {"GPUFLEET_RUN": "2"}
    assert agent.decide("end 1") and warm_restart.read(path) == Decision(0, {}, end=1)
    assert not agent.decide("ping")
    let_go(path)
    assert not path.exists() and tmp_path.is_dir()  # the job folder is not the agent's own


def test_a_node_that_cannot_make_the_job_folder_uses_a_folder_it_removes(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    env = {"GPUFLEET_JOB_DIR": str(tmp_path / "file" / "job")}
    # in an image that folder would not be mounted: no file, the launcher ends on a failure
    assert restart_file_of(env, "n1", in_image=True) is None
    path = restart_file_of(env, "n1")
    assert path is not None and path.parent.is_dir() and path.parent.name.startswith(OWN_DIR)
    path.write_text("{}")
    let_go(path)
    assert not path.parent.exists()
