"""Loss from printed lines and planned steps from a script's arguments."""

from __future__ import annotations

import math
import re

import pytest

from gpufleet.telemetry.log_progress import loss_in, total_steps_in


@pytest.mark.parametrize(("line", "loss"), [
    ("step 3: loss 0.5336", 0.5336),
    ("iter 10: loss 3.2134, time 20.31ms, mfu -100.00%", 3.2134),  # nanoGPT's step line
    ("step 0: train loss 4.2158, val loss 4.2196", 4.2158),  # nanoGPT's eval line
    ("{'loss': 2.31, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': 0.1}", 2.31),  # HF Trainer
    ("Epoch 1 | Loss: 0.25", 0.25),
    ("loss=1.5e-3 lr=0.1", 0.0015),
    ('{"loss": 7}', 7.0),
])
def test_common_shapes_give_the_training_loss(line: str, loss: float) -> None:
    assert loss_in(line) == pytest.approx(loss)


@pytest.mark.parametrize("line", [
    "{'eval_loss': 2.0, 'eval_runtime': 1.2}", "val loss 3.0", "test loss: 1.0", "lossy 3",
    "total_loss: 5.5", "loss inf", "no numbers here", "validation loss = 2.0"])
def test_other_lines_give_none(line: str) -> None:
    assert loss_in(line) is None


def test_a_nan_loss_is_kept_so_the_precision_rule_can_see_it() -> None:
    value = loss_in("step 5 loss nan")
    assert value is not None and math.isnan(value)


def test_a_users_pattern_replaces_the_common_shapes() -> None:
    pattern = re.compile(r"objective=([0-9.]+)")
    assert loss_in("objective=0.75 loss 9", pattern) == 0.75
    assert loss_in("loss 9", pattern) is None


@pytest.mark.parametrize(("args", "steps"), [
    (["config/train.py", "--max_iters=5000"], 5000),
    (["--max-steps", "300", "--lr", "1"], 300),
    (["--batch_size=4", "--total_steps=12"], 12),
    (["--max_steps"], None),  # no value
    (["--max_steps", "-1"], None),  # HF Trainer's "not set"
    (["--epochs", "3"], None),  # not steps
    (["max_iters=5"], None),  # not an option
])
def test_total_steps_from_plain_arguments(args: list[str], steps: int | None) -> None:
    assert total_steps_in(args) == steps
