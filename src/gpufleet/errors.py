"""Errors a user can cause, and how the CLI reports them.

    GpufleetError                 one clear line, exit code 2 (bad input or a refused request)
    +-- SpecError                 a spec field is invalid; carries every problem of one spec
    +-- NotFoundError             a cluster or job name that does not exist
    +-- ConflictError             a name already taken, a cluster busy or already stopped
    +-- AllocationError           the pool cannot satisfy a request; says what is free

Anything else reaching the CLI is a bug and is shown as such.
"""

from __future__ import annotations


class GpufleetError(Exception):
    """A user-facing error: `str(err)` is the whole message, `exit_code` what the CLI returns."""

    exit_code = 2


class SpecError(GpufleetError):
    """One or more invalid fields. Each problem names its field so the user can fix all at once."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{field}: {msg}" for field, msg in problems))


class NotFoundError(GpufleetError):
    pass


class ConflictError(GpufleetError):
    pass


class AllocationError(GpufleetError):
    pass
