"""How a failure reads, and which final status and reason a job ends with. Pure.

Kept apart from the machine so the wording users and tests read ("rank 1 failed (exit code
1): ValueError: boom") lives in one place, and so the order of precedence of the final status
(a supervisor error, then a failure that used up the restarts, then a stop, then the exit code)
can be read at a glance.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.status import JobStatus
from gpufleet.supervise import hang, restarts
from gpufleet.supervise.blame import Tail
from gpufleet.supervise.events import WorkersExited
from gpufleet.supervise.logs import last_exception

SUCCEEDED_REASON = "all workers exited 0"
__all__ = ["SUCCEEDED_REASON", "Ending", "Tail", "failure", "final"]


@dataclass(frozen=True)
class Ending:
    """What the machine knows when the job ends (see `machine.State.ending`)."""

    code: int | None  # the last exit code of the worker group (None: ended, not exited)
    error: str | None  # the supervisor's own error
    final_failure: str | None  # a failure that ended restarts (or a hang)
    stop_reason: str | None
    exited_for_resize: bool  # the workers had exited 0 to be resized when the stop came


def failure(exited: WorkersExited | None, found: hang.Hang | None, step: int | None,
            checkpoint_step: int | None) -> restarts.Failure:
    """The failure of one run: a hang (`found`) or a failed exit."""
    if found is not None:
        return restarts.Failure(signature=f"hang: rank {found.rank}", description=found.description,
                                step=step, checkpoint_step=checkpoint_step)
    assert exited is not None
    exit_text = restarts.describe_exit(exited.rank_code if exited.rank_code is not None
                                       else exited.code)
    where = f"rank {exited.rank}" if exited.rank is not None else "a worker"
    description = f"{where} failed ({exit_text})" + (f": {exited.error}" if exited.error else "")
    return restarts.Failure(signature=restarts.signature(exited.rank, exit_text, exited.error),
                            description=description, step=step, checkpoint_step=checkpoint_step)


def final(end: Ending, asked: str | None, stop_requested: str,
          tail: Tail | None) -> tuple[JobStatus, str]:
    """The final status and reason. `asked`: the reason `gpufleet stop` left on the job's row
    before it signalled us (`stop_requested` is its wording: it wins over the signal's own);
    `tail`: how the failure reads (blame.Tail), None when the logs never opened."""
    code = end.code
    if end.error is not None:
        return JobStatus.FAILED, end.error
    if end.final_failure is not None and end.stop_reason is None:
        return JobStatus.FAILED, end.final_failure
    if end.stop_reason is not None and (code != 0 or end.exited_for_resize):
        return JobStatus.STOPPED, asked if asked == stop_requested else end.stop_reason
    if code == 0:
        return JobStatus.SUCCEEDED, SUCCEEDED_REASON
    if tail is None:
        return JobStatus.FAILED, f"torchrun exited with code {code}"
    where = f"rank {tail.rank}" if tail.rank is not None else "a worker"
    exit_code = tail.rank_code if tail.rank_code is not None else code
    if tail.recorded and tail.error:  # the rank's own exception: exact, no log lines needed
        return JobStatus.FAILED, f"{where} failed (exit code {exit_code}): {tail.error}"
    error = tail.error or last_exception(list(tail.last))
    return JobStatus.FAILED, (f"{where} failed{': ' + error if error else ''} (exit code "
                              f"{exit_code}); last lines:\n" + "\n".join(tail.last))
