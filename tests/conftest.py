"""Shared fixtures: small managers and a slice of the bundled trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload.sim.mooncake import bundled_trace_path


@pytest.fixture
def trace_slice(tmp_path: Path) -> Path:
    """The first 300 requests of the bundled trace, as a file of its own."""
    lines = bundled_trace_path().read_text().splitlines()[:300]
    path = tmp_path / "slice.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
