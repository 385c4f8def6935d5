"""The terminal under a live panel: keys pressed while it is drawn are not echoed.

rich's `Live` redraws its panel in place, moving the cursor up as many lines as its last
drawing had. The terminal echoes Ctrl-C as "^C" where the cursor is, right after the panel's
bottom border; a panel as wide as the terminal makes that echo wrap onto a new line, so the
next drawing (the last one, as the panel stops) starts a line too low and leaves the old top
border behind, torn, above the summary. With echo off while the panel lives, only rich moves
the cursor. Nothing else changes: Ctrl-C still interrupts, and the keys still reach the shell.
"""

from __future__ import annotations

import contextlib
import os
import termios
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def unechoed(stream: IO[str]) -> Iterator[None]:
    """Turn the echo of `stream`'s terminal off until the block ends (however it ends). Not a
    terminal, or a job in the background (changing its terminal would stop it, SIGTTOU):
    nothing to do."""
    try:
        fd = stream.fileno()
        saved = termios.tcgetattr(fd)
        foreground = os.tcgetpgrp(fd) == os.getpgrp()
    except (AttributeError, OSError, ValueError, termios.error):
        foreground = False
    if not foreground:
        yield
        return
    quiet = list(saved)
    quiet[3] = saved[3] & ~termios.ECHO  # lflag
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, termios.error):  # the terminal went away meanwhile
            termios.tcsetattr(fd, termios.TCSANOW, saved)
