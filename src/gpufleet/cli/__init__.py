"""The `gpufleet` command: one thin verb per task, all input through `spec`, all work done by
the library (`lifecycle`, `plan`, `views`), all state in `store`.

One module per command group; options shared between commands are declared once in
`options`. Errors a user can cause are `GpufleetError`s: printed as one line, exit code 2.
torch is never imported here; only the training processes import it.
"""

from __future__ import annotations

import sys
from typing import NoReturn

# The order of these imports is the order of the commands in `gpufleet --help`.
# isort: off
from gpufleet.cli import catalog, plan, clusters, pools, jobs, queue, dashboard, measure  # noqa: F401
from gpufleet.cli import server, admin  # noqa: F401
# isort: on
from gpufleet.cli.app import app, err, silence_stdout
from gpufleet.cli.lean import lean
from gpufleet.errors import GpufleetError

__all__ = ["app", "main"]


def main() -> None:
    try:
        lean(app, sys.argv[1:])()
    except BrokenPipeError:  # `gpufleet list | head -1`: the reader has all it wanted
        silence_stdout()
        sys.exit(1)
    except GpufleetError as e:
        _fail(e)
    except Exception as e:  # an sqlite3 error about the state file that no store call caught
        from gpufleet.home import home_path
        from gpufleet.state_file import db_error

        state = db_error(home_path() / "state.db", e)
        if state is None:
            raise
        _fail(state)


def _fail(e: GpufleetError) -> NoReturn:
    from rich.text import Text

    err.print(Text.assemble(("error: ", "bold red"), str(e)), highlight=False, soft_wrap=True)
    sys.exit(e.exit_code)
