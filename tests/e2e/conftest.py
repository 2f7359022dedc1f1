"""Every test in this folder is end to end: marked ``e2e`` so ``-m "not e2e"`` leaves them out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "e2e":
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def artefacts(tmp_path: Path) -> Path:
    """Where a test leaves what a person may want to look at (screenshots): the folder named
    by ``KVSCOPE_ARTEFACTS`` (a CI job uploads it), else the test's own ``tmp_path``."""
    named = os.environ.get("KVSCOPE_ARTEFACTS")
    if not named:
        return tmp_path
    folder = Path(named)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
