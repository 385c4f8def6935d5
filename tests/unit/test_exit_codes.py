"""`status.exit_code`: what `run` and `logs -f` exit with after waiting for a job."""

from __future__ import annotations

import pytest

from gpufleet.status import CTRL_C_EXIT, JobStatus, QueueStatus, exit_code


@pytest.mark.parametrize(("status", "ctrl_c", "code"), [
    (JobStatus.SUCCEEDED, False, 0), (JobStatus.FAILED, False, 1), (JobStatus.STOPPED, False, 1),
    (JobStatus.INTERRUPTED, False, 1), (QueueStatus.REFUSED, False, 1),
    (JobStatus.INTERRUPTED, True, CTRL_C_EXIT), (JobStatus.SUCCEEDED, True, 0)])
def test_a_waited_for_job_gives_its_outcome_as_the_exit_code(status: str, ctrl_c: bool,
                                                             code: int) -> None:
    assert exit_code(status, ctrl_c) == code
