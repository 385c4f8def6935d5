"""The bootstrap arms once per rank: a process the rank starts inherits RANK but is not it."""

from __future__ import annotations

import os
import sys

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
