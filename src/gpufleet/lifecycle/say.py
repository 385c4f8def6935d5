"""Where a library module's words for a person go: the caller's `say`, else the log.

Library modules (lifecycle/, pool/, sched/, backends/, supervise/) never print: a function
with something to tell (an engine's pending reason, an allocation it could not release) takes
`say` from its caller, the CLI or the server, which knows where a person reads. A caller that
passes none (the server's loop, a reconcile) leaves the words to the `gpufleet` logger, which
an embedding program routes as it likes; unconfigured, Python writes warnings to stderr as
the bare message, which is the line these words always made there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

Say = Callable[[str], None]

_log = logging.getLogger("gpufleet")


def to_log(text: str) -> None:
    _log.warning("gpufleet: %s", text)


def told(say: Say | None) -> Say:
    """`say`, or the log when the caller gave none."""
    return say if say is not None else to_log
