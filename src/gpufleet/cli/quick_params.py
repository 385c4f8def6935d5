"""Parameter values typer need not hand to Pydantic: an option left out (None) and a plain
string for a `str` parameter.

typer (0.2x) checks every value with a Pydantic TypeAdapter, and building the first one imports
Pydantic: a quarter of a second in `gpufleet list`. `quick` gives each parameter a checker that
answers those two cases itself and leaves any other value to typer's adapter. It reaches into
typer's private `_coercion`; `cli/help.py` does without it where that module does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typer._coercion import RuntimeParam, build_runtime_param


@dataclass(frozen=True)
class _QuickParam(RuntimeParam):
    """A value typer's adapter would hand back unchanged (a str for a str) is kept as is;
    anything else is checked by the adapter, built on first use. None never reaches here."""

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and self.annotation in (str, str | None):
            return value
        return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)


def quick(params: list[Any]) -> list[Any]:
    """`params`, each not yet given typer's checker given the quick one."""
    for p in params:
        if getattr(p, "_runtime_param", False) is None:  # typer's, not built yet
            p._runtime_param = _QuickParam(p.type_descriptor.parameter_info,
                                           p.type_descriptor.annotation)
    return params
