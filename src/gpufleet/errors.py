"""Errors a user can cause, and how the CLI reports them.

    GpufleetError                 one clear line, exit code 2 (bad input or a refused request)
    +-- SpecError                 a spec field is invalid; carries every problem of one spec
    +-- NotFoundError             a cluster or job name that does not exist
    +-- ConflictError             a name already taken, a cluster busy or already stopped
    +-- AllocationError           the pool cannot satisfy a request; says what is free
    +-- StateError                the state folder or state file cannot be used (shared, a
                                  link, damaged, removed); says why and what to do
    +-- ForbiddenError            no token, an unknown one, or a user acting on what is not
                                  theirs (another's job, an admin command)
    +-- ServerError               a server that cannot be reached, or speaks another API version
    +-- ImageError                a job's image cannot run on a node: no runtime, not there and
                                  not pullable, no Python/torch, CUDA newer than the driver

Anything else reaching the CLI is a bug and is shown as such.
"""

from __future__ import annotations

EXCERPT_CHARS = 80  # the most of a user's value an error message repeats
MESSAGE_CHARS = 600  # the most one problem's message may be, whatever went into it


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """`value` as an error message may repeat it: on one line, and cut to `limit` characters
    with "...". An input may be megabytes (a YAML file, a flag); its message stays a line."""
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class GpufleetError(Exception):
    """A user-facing error: `str(err)` is the whole message, `exit_code` what the CLI returns."""

    exit_code = 2


class SpecError(GpufleetError):
    """One or more invalid fields. Each problem names its field so the user can fix all at once."""

    def __init__(self, problems: list[tuple[str, str]]):
        # Every message site is meant to echo input through `excerpt`; this bound holds even
        # where one does not (a validator's message, a library's error text).
        self.problems = [(excerpt(field), excerpt(msg, MESSAGE_CHARS)) for field, msg in problems]
        super().__init__("; ".join(f"{field}: {msg}" for field, msg in self.problems))


class NotFoundError(GpufleetError):
    pass


class ConflictError(GpufleetError):
    pass


class AllocationError(GpufleetError):
    pass


class StateError(GpufleetError):
    pass


class ForbiddenError(GpufleetError):
    pass


class ServerError(GpufleetError):
    pass


class ImageError(GpufleetError):
    """The node's preflight of a job's image failed: one line per failing check, each naming
    the image, the node and the fix (`backends.image_preflight`)."""


class LimitError(ConflictError):
    """A team's quota, found full in the transaction that would have started the job (another
    start won the race): the queue holds the job instead."""
