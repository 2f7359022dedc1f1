"""Every test in this folder is end to end: marked ``e2e`` so ``-m "not e2e"`` leaves them out."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "e2e":
            item.add_marker(pytest.mark.e2e)
