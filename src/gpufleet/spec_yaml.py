"""Reading a job or cluster YAML file into a plain dict for `ClusterSpec.parse` / `JobSpec.parse`.

YAML anchors and aliases (`&a`, `*a`) are refused rather than expanded: a few hundred bytes of
nested aliases expand to gigabytes (the "billion laughs" file), which the loader would build in
memory and an error message would then echo. A job or cluster spec is a handful of fields, so
nothing is lost by writing the values out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import Node

from gpufleet.errors import SpecError

ANCHORS_REFUSED = "YAML anchors and aliases (&, *) are not supported; write the values out"


class _Anchor(yaml.YAMLError):
    """An anchor or alias met while composing the document (before anything is expanded)."""


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases, and keeps `2:8` a string: YAML 1.1 reads it
    as a base-60 integer (128), and `workers: 2:8` must mean the range."""

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        # peek_event is untyped in types-PyYAML
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Anchor(ANCHORS_REFUSED)
        return super().compose_node(parent, index)

    def construct_yaml_int(self, node: Any) -> Any:
        if ":" in str(node.value):
            return str(node.value)
        return super().construct_yaml_int(node)


_YamlLoader.add_constructor("tag:yaml.org,2002:int", _YamlLoader.construct_yaml_int)


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"  # PyYAML counts from 0


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error on one line, with where it is: `line 3, column 1: expected ',' or ']', but
    got '<stream end>' (in a flow sequence that starts at line 2, column 8)`. Its own text spreads this
    over several lines, the position on the last, with a copy of the line."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return " ".join(str(exc).split())
    text = f"{_at(exc.problem_mark)}: {exc.problem}"
    # the context is "while parsing a flow sequence" or "while scanning for the next token":
    # worth saying when it names a construct that starts somewhere else
    context = (exc.context or "").removeprefix("while parsing ").removeprefix("while scanning ")
    if context.startswith(("a ", "an ")) and exc.context_mark is not None:
        text += f" (in {context} that starts at {_at(exc.context_mark)})"
    return text


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a job or cluster YAML file into a plain dict for `parse`."""
    p = Path(path)
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_YamlLoader)  # a SafeLoader
    except FileNotFoundError:
        raise SpecError([("file", f"no such file: {p}")]) from None
    except OSError as exc:
        raise SpecError([("file", f"cannot read {p}: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError:
        raise SpecError([("file", f"{p} is not UTF-8 text")]) from None
    except _Anchor:
        raise SpecError([("file", f"{p}: {ANCHORS_REFUSED}")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([("file", f"{p} is not valid YAML: {yaml_problem(exc)}")]) from None
    if not isinstance(data, dict):
        raise SpecError([("file", f"{p} must hold a mapping of fields")])
    return data
