"""Progress read from outside a script: its loss from the lines it prints, its planned steps
from its own arguments. Pure: text in, numbers out.

A script that never calls `gpufleet.train.report` still prints its loss, in a handful of common
shapes: `loss 2.31`, `loss: 2.31`, `loss=2.31`, `train loss 2.31` (nanoGPT), a Hugging Face
Trainer log dict `{'loss': 2.31, 'grad_norm': ...}`. Validation losses (`val loss`,
`eval_loss`, `test loss`) are not the training loss and are skipped. A user's own pattern (the
job's `loss_pattern`, its first group the number) replaces these.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
# `loss`, as a whole word, maybe quoted (a dict key), then an optional : or =, then the number
LOSS = re.compile(r"(?<![\w.])loss\b['\"]?\s*[:=]?\s*" + _NUMBER, re.IGNORECASE)
_NOT_TRAINING = re.compile(r"(?:val|valid|validation|eval|test|dev)[\s_-]*$", re.IGNORECASE)

# argument names scripts plainly use for their number of optimizer steps
STEP_ARGS = ("max_iters", "max_steps", "total_steps", "num_steps", "train_steps", "max_iter")


def loss_in(line: str, pattern: re.Pattern[str] | None = None) -> float | None:
    """The training loss a log line states, or None."""
    if pattern is not None:
        m = pattern.search(line)
        return _number(m.group(1)) if m and m.group(1) is not None else None
    for m in LOSS.finditer(line):
        if _NOT_TRAINING.search(line[:m.start()].rstrip("'\" {,")):
            continue
        return _number(m.group(1))
    return None


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if not math.isinf(value) else None


def total_steps_in(args: list[str]) -> int | None:
    """The planned number of steps from arguments like `--max_iters=5000` or `--max-steps 300`
    (dashes and underscores alike), or None when the script's arguments do not say plainly."""
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        if name.replace("-", "_") not in STEP_ARGS:
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None
