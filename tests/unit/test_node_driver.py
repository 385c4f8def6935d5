"""The watch over a run's nodes that the Ray and the Slurm drivers share
(backends/node_driver.py), against an engine whose polls are a script: fail fast, a lost node
found at once or on a second look, a node's own failure, the stop, and the lost nodes' file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.backends import node_driver
from gpufleet.backends.exits import NODE_LOST_EXIT
from gpufleet.backends.node_driver import NodeDriver

PLAN = {"nodes": [{"name": "head", "node_id": "n1"}, {"name": "worker1", "node_id": "n2"}]}


class Scripted(NodeDriver):
    """Each poll is the next (ended, lost) of the script (the last one repeats)."""

    def __init__(self, polls: list[tuple[dict[int, int], set[str]]], lost_path: Path,
                 confirmed: tuple[set[str], str] = (set(), ""), suspect: bool = False):
        super().__init__(PLAN, lost_path)
        self.polls, self.confirmed, self.suspected = polls, confirmed, suspect
        self.ended: list[float] = []
        self.confirms = 0

    def place(self) -> int | None:
        return None

    def poll(self) -> tuple[dict[int, int], set[str]]:
        return self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]

    def confirm_lost(self) -> tuple[set[str], str]:
        self.confirms += 1
        return self.confirmed

    def suspect(self) -> bool:
        return self.suspected

    def lost_text(self, lost: set[str], how: str) -> str:
        return f"node {self.named(lost)} was lost ({how})"

    def end_all(self, grace_s: float) -> None:
        self.ended.append(grace_s)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_driver.time, "sleep", lambda _s: None)


def test_every_node_done_is_a_success_and_nothing_is_ended(tmp_path: Path) -> None:
    d = Scripted([({}, set()), ({0: 0}, set()), ({0: 0, 1: 0}, set())], tmp_path / "p.lost")
    assert d.run() == 0
    assert d.ended == [] and d.confirms == 0 and not (tmp_path / "p.lost").exists()


def test_a_node_that_fails_on_its_own_ends_the_others_with_its_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = Scripted([({}, set()), ({1: 3}, set()), ({0: 1, 1: 3}, set())], tmp_path / "p.lost")
    assert d.run() == 3
    assert d.confirms == 1  # looked for a lost peer before blaming worker1
    assert d.ended == [10.0]
    assert "gpufleet: node worker1 exited with code 3; ending the other nodes" in \
        capsys.readouterr().out


def test_the_other_nodes_get_to_end_by_themselves_before_they_are_signalled(
        tmp_path: Path) -> None:
    """Their torchrun names its own failed ranks once it noticed them: a SIGTERM at once left
    no such summary, and the failure was blamed on the victim that ended first."""
    d = Scripted([({}, set()), ({1: 3}, set()), ({1: 3}, set()), ({1: 3}, set()),
                  ({0: 1, 1: 3}, set()), ({0: 1, 1: 3}, set())], tmp_path / "p.lost")
    assert d.run() == 3 and d.ended == [10.0]
    assert len(d.polls) == 1  # polled until head ended too, not past it


def test_a_peer_that_does_not_end_by_itself_is_ended_after_the_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000))
    monkeypatch.setattr(node_driver.time, "monotonic", lambda: float(next(clock)))
    d = Scripted([({}, set()), ({1: 3}, set())], tmp_path / "p.lost")
    assert d.run() == 3 and d.ended == [10.0]
    assert next(clock) <= node_driver.PEERS_END_S + 3  # the wait was bounded


def test_a_failure_caused_by_a_lost_peer_names_the_peer_and_writes_it_beside_the_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = Scripted([({0: 1}, set())], tmp_path / "p.lost", confirmed=({"n2"}, "its machine died"))
    assert d.run() == NODE_LOST_EXIT
    assert "NodeLostError: node worker1 (n2) was lost (its machine died)" in capsys.readouterr().out
    assert json.loads((tmp_path / "p.lost").read_text()) == ["n2"]
    assert d.ended == [5.0]


def test_a_node_the_engine_reports_lost_needs_no_second_look(tmp_path: Path) -> None:
    d = Scripted([({}, {"n1", "gone"})], tmp_path / "p.lost")
    assert d.run() == NODE_LOST_EXIT and d.confirms == 0
    assert json.loads((tmp_path / "p.lost").read_text()) == ["gone", "n1"]


def test_an_engine_hint_of_a_lost_node_is_looked_into_before_any_node_fails(
        tmp_path: Path) -> None:
    d = Scripted([({}, set())], tmp_path / "p.lost", confirmed=({"n1"}, "node failure"),
                 suspect=True)
    assert d.run() == NODE_LOST_EXIT and d.confirms == 1


def test_a_stop_ends_every_node_and_exits_as_sigterm_would(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = Scripted([({}, set())], tmp_path / "p.lost")
    d.stop_asked = True
    assert d.run() == 143 and d.ended == [10.0]
    assert "stop asked: ending torchrun on every node" in capsys.readouterr().out


def test_a_placement_failure_is_the_exit_without_a_watch(tmp_path: Path) -> None:
    class Unplaced(Scripted):
        def place(self) -> int | None:
            return 70

    d: Any = Unplaced([({}, set())], tmp_path / "p.lost")
    assert d.run() == 70 and d.ended == []
