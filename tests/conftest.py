"""Markers by folder: everything under tests/integration is `integration` (real processes,
servers, a browser), everything under tests/unit is `unit` (pure, fast), so a new file is marked
by where it lives and `pytest -m unit` is always the quick loop."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.path)).relative_to(_HERE).parts[0]
        if folder in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, folder))
