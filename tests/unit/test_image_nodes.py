"""The image asked of a pool's nodes before a grant: each node's answer read into one line, an
engine without the question left to its nodes' start-time check (the real SSH nodes answer in
tests/integration/test_image_machines.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.backends.image_nodes import ChecksImages, failures, node_answer
from gpufleet.backends.node_image import IMAGE_FAILED_EXIT

SPEC: dict[str, Any] = {"image": "reg.example/train:3", "pull": "missing", "opts": [], "shm_size": None}


class Asked:
    """An engine whose nodes answer through a plain function of the node id."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[list[str]] = []

    def check_image(self, node_ids: Sequence[str], container: Mapping[str, Any],
                    ref: str = "") -> dict[str, str]:
        self.asked.append(list(node_ids))
        return {n: self.answer(n) for n in node_ids}


def test_a_nodes_exit_says_whether_the_image_passed_and_why_not() -> None:
    assert node_answer(0, "image X pulled on n1\n", "", "X", "n1") == ""
    assert node_answer(IMAGE_FAILED_EXIT, "a note\nimage X is not on n1 and could not be pulled\n",
                       "", "X", "n1") == "image X is not on n1 and could not be pulled"
    assert node_answer(None, "", "", "X", "n1") == (
        "image X could not be checked on n1: no answer in time")
    got = node_answer(1, "", "warning\n/usr/bin/python3: No module named gpufleet\n", "X", "n1")
    assert got == "image X could not be checked on n1: /usr/bin/python3: No module named gpufleet"
    assert node_answer(255, "", "", "X", "n1") == "image X could not be checked on n1: exit 255"


def test_every_failing_node_is_a_line_in_the_pools_order_and_passing_ones_none() -> None:
    engine = Asked(lambda n: "" if n == "10.0.0.2" else f"image reg.example/train:3 is not on {n}")
    told: list[str] = []
    got = failures(engine, ["10.0.0.3", "10.0.0.2", "10.0.0.1"], SPEC, say=told.append)
    assert got == ["image reg.example/train:3 is not on 10.0.0.3",
                   "image reg.example/train:3 is not on 10.0.0.1"]
    assert engine.asked == [["10.0.0.3", "10.0.0.2", "10.0.0.1"]]
    assert told == ["checking image reg.example/train:3 on 3 node(s) (a pull, where needed, "
                    "is waited for)"]
    assert failures(Asked(lambda _n: ""), ["a", "b"], SPEC) == []


def test_a_node_missing_from_the_answers_fails_and_an_engine_that_cannot_ask_is_none() -> None:
    class Partial(Asked):
        def check_image(self, node_ids: Sequence[str], container: Mapping[str, Any],
                        ref: str = "") -> dict[str, str]:
            return {"a": ""}

    assert failures(Partial(None), ["a", "b"], SPEC) == [
        "image reg.example/train:3: node b did not answer its check"]
    assert isinstance(Asked(None), ChecksImages)
    assert failures(object(), ["a"], SPEC) is None  # checked on the node as the run starts
    assert failures(Asked(lambda _n: "x"), [], SPEC) is None  # no nodes: nothing to ask
