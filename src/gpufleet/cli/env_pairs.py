"""A job's `env`: the YAML file's mapping with `--env NAME=VALUE` flags on top (flags win).

Checked here, before `JobSpec.parse`, because the two forms are merged into one dict first: a
YAML `env` that is not a mapping (`env: "A=1"`, `env: 5`, `env: [[1, 2, 3]]`) cannot be merged,
and `dict()` on it would either fail with a traceback or silently turn `[[1, 2]]` into {1: 2}.
"""

from __future__ import annotations

from typing import Any

from gpufleet.errors import SpecError, excerpt

ENV_FORM = "a mapping of NAME: value, e.g. env: {OMP_NUM_THREADS: 4} (or --env NAME=VALUE flags)"


def merged_env(from_file: Any, flags: list[str]) -> dict[Any, Any] | None:
    """The YAML file's `env` (None or a mapping) updated by `--env NAME=VALUE` flags; None when
    neither gives any. Names and values are checked later by `JobSpec` (it names each one)."""
    if from_file is not None and not isinstance(from_file, dict):
        raise SpecError([("env", f"must be {ENV_FORM}; got {excerpt(repr(from_file))}")])
    pairs: dict[Any, Any] = dict(from_file or {})
    for item in flags:
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError([("env", f"'{excerpt(item)}' is not NAME=VALUE")])
        pairs[key] = value
    return pairs or None

