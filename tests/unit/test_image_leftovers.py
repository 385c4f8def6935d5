"""A job's leftover containers on a node: listed by the job's label, each removed, with the
runtime's answers given by a function (the real runtime runs in tests/integration)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpufleet.backends.image_leftovers import remove_job_containers
from gpufleet.backends.runtime import Ran


def test_the_jobs_containers_are_listed_by_label_and_each_removed() -> None:
    calls: list[list[str]] = []

    def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        calls.append(list(argv))
        if argv[1:2] == ["--version"]:
            return Ran(0, "podman version 4.3.1\n", "")
        if argv[1] == "ps":
            return Ran(0, "c0ffee\nbeef01\n", "")
        return Ran(0 if argv[-1] == "c0ffee" else 1, "", "")

    got = remove_job_containers("train-7", run, {}, lambda n: f"/usr/bin/{n}")
    assert got == 1  # the second rm failed: counted as not removed
    assert ["/usr/bin/podman", "ps", "-a", "-q", "--filter", "label=gpufleet.job=train-7"] in calls
    assert calls[-2:] == [["/usr/bin/podman", "rm", "-f", "c0ffee"],
                          ["/usr/bin/podman", "rm", "-f", "beef01"]]


def test_no_runtime_on_the_node_is_none_not_an_error() -> None:
    def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> Ran:
        raise AssertionError("nothing runs without a runtime")

    assert remove_job_containers("j", run, {}, lambda _n: None) is None
