"""The SDK's lazily imported names stay the functions they name.

Importing a submodule sets it as an attribute of its package, so a module
`gpufleet/train/prepared.py` would replace `gpufleet.train.prepared` (the function) the
moment anything imported it: `train.prepared(model)` then fails in every script."""

from __future__ import annotations

from pathlib import Path

import gpufleet.train as train


def test_no_train_module_is_named_like_a_lazy_sdk_name() -> None:
    modules = {p.stem for p in Path(train.__file__).parent.glob("*.py")}
    assert not modules & set(train._LAZY)
    assert set(train._LAZY) <= set(train.__all__)
