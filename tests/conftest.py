"""Shared fixtures: a slice of the bundled trace, raw ZMQ publishers closed after each test;
Hypothesis untimed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from offload.sim.mooncake import bundled_trace_path
from tests.support.zmq_peers import RawPublisher

# Hypothesis times every example (a 200 ms deadline) and fails a property whose first
# examples took over 1 s to generate (HealthCheck.too_slow, five deadlines): two timed
# assertions, which a loaded machine's pause fails while the property holds. Untimed,
# too_slow waits 30 s. Properties that set their own settings keep these defaults.
settings.register_profile("kvscope", deadline=None)
settings.load_profile("kvscope")


@pytest.fixture
def trace_slice(tmp_path: Path) -> Path:
    """The first 300 requests of the bundled trace, as a file of its own."""
    lines = bundled_trace_path().read_text().splitlines()[:300]
    path = tmp_path / "slice.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def peers() -> Iterator[list[RawPublisher]]:
    """Raw publishers a test opens (append to the list); closed after the test."""
    opened: list[RawPublisher] = []
    yield opened
    for peer in opened:
        peer.close()
