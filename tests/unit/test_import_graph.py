"""No import cycle anywhere in src/, counting imports inside functions too.

A cycle dodged by importing inside a function still ties two modules into one unit that can
only be understood, tested and changed together; this test keeps the layers honest. Imports
under `if TYPE_CHECKING:` count too (issue 28): a circle the type checker needs is a circle a
reader needs, even when Python never runs it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, typing_too: bool = False) -> list[tuple[str, list[str]]]:
    """(module, names) for every import that runs, TYPE_CHECKING blocks left out unless
    `typing_too`."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing_too:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [a.name for a in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@functools.cache
def _trees() -> dict[str, ast.Module]:
    """Every module of src/, parsed once for all the graphs below."""
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in SRC.rglob("*.py")}


def import_graph(typing_too: bool = False) -> dict[str, set[str]]:
    modules = _trees()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, tree in modules.items():
        for target, names in _imports(tree, typing_too):
            if target not in modules:
                continue
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            for dep in subs or [target]:
                if dep != name:
                    graph[name].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_the_finder_sees_a_cycle_made_of_function_level_imports() -> None:
    tree = ast.parse("def f():\n    from gpufleet.b import x\n")
    assert _imports(tree) == [("gpufleet.b", ["x"])]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_type_checking_imports_are_counted() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gpufleet.b\n")
    assert _imports(tree, typing_too=True)[-1] == ("gpufleet.b", [])
    assert _imports(tree) == [("typing", ["TYPE_CHECKING"])]  # what runs, for the other test


def test_src_has_no_import_cycle_type_checking_imports_counted() -> None:
    """The supervisor hands its helpers the run's `RunState`, never itself; the API's route
    modules take `Ctx` from server/ctx.py; the doctor's facts are data in doctor/model.py."""
    graph = import_graph(typing_too=True)
    assert "gpufleet.lifecycle.jobs" in graph  # the walk found the package
    assert "gpufleet.supervise.run_state" in graph["gpufleet.supervise.actions"]
    assert cycles(graph) == []
