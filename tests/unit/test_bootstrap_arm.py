"""The bootstrap arms once per rank: a process the rank starts inherits RANK but is not it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.bootstrap import importwatch, worker


def test_a_child_of_an_armed_rank_does_not_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("GPUFLEET_REPORT_ADDR", "127.0.0.1:9")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", "/nonexistent/error.json")
    monkeypatch.setenv(worker.ARMED_IN, str(os.getppid()))  # armed in the parent, not here
    hook = sys.excepthook
    watched = dict(importwatch._FINDER.watched)
    worker.arm()
    assert sys.excepthook is hook
    assert importwatch._FINDER.watched == watched
    assert os.environ[worker.ARMED_IN] == str(os.getppid())


def test_the_rank_itself_arms_its_error_file_and_watchers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("GPUFLEET_REPORT_ADDR", "127.0.0.1:9")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", "/nonexistent/error.json")
    monkeypatch.delenv(worker.ARMED_IN, raising=False)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored after the test
    monkeypatch.setattr(importwatch._FINDER, "watched", {})
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    hook = sys.excepthook
    worker.arm()
    assert sys.excepthook is not hook
    assert os.environ[worker.ARMED_IN] == str(os.getpid())
    assert "torch.distributed.fsdp._fully_shard._fully_shard" in importwatch._FINDER.watched \
        or "torch.distributed.fsdp._fully_shard._fully_shard" in sys.modules


def test_the_step_hook_is_kept_out_of_torch_compile_without_importing_it_early(
        tmp_path: Path) -> None:
    """The step hook is registered through torch._dynamo's `disable` once torch imports it
    (at the first optimizer), never by importing it at `import torch` (1.1-1.5 s a worker).
    `torch.compiler.disable` at the optimizer module's import is no answer: `torch.compiler`
    is not there yet while torch imports itself, and the hook stayed unwrapped."""
    code = (
        "import sys\n"
        "from gpufleet.bootstrap import worker\n"
        "worker.arm()\n"
        "import torch\n"
        "early = 'torch._dynamo' in sys.modules\n"
        "torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n"
        "from torch.optim.optimizer import _global_optimizer_post_hooks as hooks\n"
        "print(early, [getattr(h, '__wrapped__', None) is not None for h in hooks.values()])\n")
    env = {**os.environ, "RANK": "0", "GPUFLEET_REPORT_ADDR": "127.0.0.1:9",
           "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}
    env.pop(worker.ARMED_IN, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "False [True]", done.stdout + done.stderr
