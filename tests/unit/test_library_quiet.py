"""Library modules do not print: what they have to tell a person goes to the caller's `say`
(or the log, `lifecycle.say`), so the CLI, the server and an embedding program each decide
where it is read. A module that is a program of its own (it has a `__main__` block: the
supervisor, whose stderr is its log; the keeper; a node's driver, whose stdout is the channel
its lines travel on) may write to its own output."""

from __future__ import annotations

import ast
from pathlib import Path

import gpufleet

LIBRARY = ("lifecycle", "pool", "sched", "backends", "supervise")
ROOT = Path(gpufleet.__file__).resolve().parent
# the programs' own parts: the node driver's base is the body of ray_run's and slurm_run's
# programs (its stdout is the channel the supervisor reads the nodes' lines and a lost node on)
PROGRAM_PARTS = ("backends/node_driver.py",)


def _is_program(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in tree.body)


def _loud(f: ast.expr) -> bool:
    """print, or a write to sys.stdout / sys.stderr."""
    if isinstance(f, ast.Name):
        return f.id == "print"
    return (isinstance(f, ast.Attribute) and f.attr in ("write", "writelines")
            and isinstance(f.value, ast.Attribute) and f.value.attr in ("stdout", "stderr")
            and isinstance(f.value.value, ast.Name) and f.value.value.id == "sys")


def _prints(tree: ast.Module) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _loud(node.func)]


def _offenders() -> tuple[list[str], list[str]]:
    loud, programs = [], []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            name = str(path.relative_to(ROOT))
            if _is_program(tree) or name in PROGRAM_PARTS:
                programs.append(name)
            else:
                loud += [f"{name}:{line}" for line in _prints(tree)]
    return loud, programs


def test_library_modules_do_not_print() -> None:
    loud, programs = _offenders()
    assert loud == [], f"print or sys.stdout/stderr write in a library module: {loud}"
    assert "supervise/supervisor.py" in programs  # the check sees the programs it excuses


def test_the_check_finds_a_print_and_a_write() -> None:
    source = ("import sys\ndef f():\n    print('x')\n    sys.stderr.write('y')\n"
              "    sys.stdout.flush()\n")
    assert _prints(ast.parse(source)) == [3, 4]
    assert not _is_program(ast.parse(source))
    assert _is_program(ast.parse(source + "if __name__ == '__main__':\n    f()\n"))


def test_words_nobody_asked_for_reach_stderr_as_the_line_they_always_made() -> None:
    """A caller that passes no `say` (the server's loop, a reconcile, the supervisor): the
    `gpufleet` logger, which Python writes to stderr unconfigured, as the bare message."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "from gpufleet.lifecycle.say import told; "
                           "told(None)('cluster c: scancel 7: refused'); told(print)('here')"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stderr == "gpufleet: cluster c: scancel 7: refused\n"
    assert done.stdout == "here\n"
