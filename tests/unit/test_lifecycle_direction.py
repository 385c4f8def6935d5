"""`lifecycle` -> `supervise` one way: lifecycle starts a supervisor and uses nothing else of it.

What the CLI, the server and the queue share (a job's cost, the model-state metric names, the
durable copy's state, the resume words) lives below both, so `supervise` can change without
`lifecycle` and the other way round. Every import counts here: at the top, inside a function
and under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
from pathlib import Path

LIFECYCLE = Path(__file__).resolve().parents[2] / "src" / "gpufleet" / "lifecycle"

# the one crossing: the supervisor, which `runs` starts (here or as `-m ...supervisor`)
STARTS_A_SUPERVISOR = {("gpufleet.supervise.supervisor", "Supervisor")}
# the elastic sizes a job may take: admission picks the first (`submit.first_world`) with the
# same pure function the supervisor resizes by, so the two cannot disagree
SHARED_POLICY = {("gpufleet.supervise.elastic", "elastic_plan")}


def supervise_imports(source: str) -> set[tuple[str, str]]:
    """(module, name) of every import from `gpufleet.supervise` in `source`, wherever it is."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gpufleet.supervise" or node.module.startswith("gpufleet.supervise."):
                found |= {(node.module, a.name) for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {(a.name, "") for a in node.names if a.name.startswith("gpufleet.supervise")}
    return found


def test_the_walk_sees_function_level_and_type_checking_imports() -> None:
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    from gpufleet.supervise.view import JobView\n"
              "def f():\n    import gpufleet.supervise.machine\n")
    assert supervise_imports(source) == {("gpufleet.supervise.view", "JobView"),
                                         ("gpufleet.supervise.machine", "")}


def test_lifecycle_imports_from_supervise_only_what_starts_a_supervisor() -> None:
    crossing: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(LIFECYCLE.glob("*.py")):
        found = supervise_imports(path.read_text()) - STARTS_A_SUPERVISOR - SHARED_POLICY
        if found:
            crossing[path.name] = found
    assert crossing == {}
    # and the crossing is there: `runs` is what starts a supervisor
    assert supervise_imports((LIFECYCLE / "runs.py").read_text()) == STARTS_A_SUPERVISOR
