"""What the supervisor does with each line the workers print (on the log reader thread): rank
0's loss when the script prints it and does not report it, then the echo to the terminal."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from gpufleet.supervise.intake import Intake
from gpufleet.telemetry.log_progress import loss_in

Echo = Callable[[int | None, str], None]


class OutputLines:
    """Called by `logs.pump` for every worker line. Never raises: a closed terminal (`| head`)
    ends the echo only, and the loss keeps being read."""

    def __init__(self, intake: Intake, loss_pattern: str | None, echo: Echo | None):
        self.intake, self.echo = intake, echo
        self.pattern = re.compile(loss_pattern) if loss_pattern else None

    def __call__(self, rank: int | None, text: str) -> None:
        if rank == 0 and not self.intake.reported_loss:
            try:
                loss = loss_in(text, self.pattern)
                if loss is not None:
                    self.intake.log_loss(time.time(), loss)
            except Exception:  # a line the pattern cannot read: no loss from it, the echo goes on
                pass
        if self.echo is not None:
            try:
                self.echo(rank, text)
            except Exception:  # the terminal went away
                self.echo = None

    def say(self, text: str) -> None:
        """A line of the supervisor's own (a restart, a resize) for the terminal."""
        if self.echo is not None:
            try:
                self.echo(None, text)
            except Exception:
                self.echo = None
