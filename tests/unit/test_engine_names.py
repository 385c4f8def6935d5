"""Outside `backends/`, no code decides by an engine's name (issue 28).

Code asks what an engine can do (`kinds.CAPABILITIES`, `isinstance(engine, Allocating)`), so
an engine added in `backends/` changes no `if kind == "slurm"` elsewhere. This walks every
comparison in src/ outside `backends/` and fails on one that holds a kind's name against
anything called `kind`/`backend` (a pool's kind, a spec's backend).
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpufleet.backends.kinds import CAPABILITIES

SRC = Path(__file__).resolve().parents[2] / "src" / "gpufleet"
_NAMED = ("kind", "backend")


def _names_an_engine(node: ast.expr) -> bool:
    """`x.kind`, `kind`, `spec.backend`, `pool.kind`: something that holds an engine's name."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name.endswith(_NAMED)


def _kind_words(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & set(CAPABILITIES)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_kind_words(e) for e in node.elts)) if node.elts else set()
    return set()


def engine_name_tests(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, kind) for each comparison of an engine's name with a kind's word."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(_names_an_engine(s) for s in sides):
            continue
        for side in sides:
            found.extend((node.lineno, w) for w in sorted(_kind_words(side)))
    return found


def test_the_finder_sees_a_comparison_by_name() -> None:
    tree = ast.parse('if pool.kind == "slurm": pass\nif spec.backend in ("ray", "sim"): pass\n'
                     'if note.kind == "checkpoint": pass\n')
    assert engine_name_tests(tree) == [(1, "slurm"), (2, "ray"), (2, "sim")]


def test_no_engine_is_named_outside_backends() -> None:
    found = {}
    for path in SRC.rglob("*.py"):
        if "backends" in path.relative_to(SRC).parts:
            continue
        hits = engine_name_tests(ast.parse(path.read_text(), str(path)))
        if hits:
            found[str(path.relative_to(SRC))] = hits
    assert found == {}
