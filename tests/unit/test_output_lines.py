"""Each worker line: rank 0's printed loss feeds the job when no report carries one; the echo
goes on until the terminal goes away, and the loss is still read after that."""

from __future__ import annotations

from typing import Any

from gpufleet.supervise.output import OutputLines


class FakeIntake:
    def __init__(self) -> None:
        self.reported_loss = False
        self.losses: list[float] = []

    def log_loss(self, t: float, value: float) -> None:
        self.losses.append(value)


def lines(pattern: str | None = None, echo: Any = None) -> tuple[OutputLines, FakeIntake]:
    intake = FakeIntake()
    return OutputLines(intake, pattern, echo), intake  # type: ignore[arg-type]


def test_rank_zero_loss_lines_feed_the_job_and_other_ranks_do_not() -> None:
    out, intake = lines()
    out(0, "step 1: loss 2.5")
    out(1, "step 1: loss 9.0")
    out(None, "agent: loss 7")
    out(0, "no loss here")
    assert intake.losses == [2.5]


def test_a_reported_loss_wins_over_the_log() -> None:
    out, intake = lines()
    intake.reported_loss = True
    out(0, "loss 1.0")
    assert intake.losses == []


def test_the_users_pattern() -> None:
    out, intake = lines(r"obj=([0-9.]+)")
    out(0, "loss 3 obj=0.5")
    assert intake.losses == [0.5]


def test_a_closed_terminal_ends_the_echo_not_the_loss() -> None:
    seen: list[str] = []

    def echo(rank: int | None, text: str) -> None:
        seen.append(text)
        if len(seen) == 2:
            raise BrokenPipeError

    out, intake = lines(echo=echo)
    out(0, "loss 1")
    out(0, "loss 2")
    out(0, "loss 3")
    out.say("gpufleet: restart")
    assert seen == ["loss 1", "loss 2"]
    assert intake.losses == [1.0, 2.0, 3.0]
