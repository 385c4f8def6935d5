"""Every test module's file name is unique across tests/: pytest imports them by base name
(there is no package around them), so a second `test_x.py` in another folder breaks the
collection of a run that takes both (the serial pass of scripts/check does)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_no_two_test_modules_share_a_file_name() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name.startswith("test_"))
    assert [n for n, c in names.items() if c > 1] == []
