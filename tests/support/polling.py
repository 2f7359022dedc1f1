"""Waiting for a live system to reach a state, for the tests that watch one.

Servers, threads and processes get there in their own time. A poll with a
generous deadline proves that the state is reached without asserting how
fast (speed is what bench/ measures), and a failure names what never happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WAIT_S = 15.0


def wait_for(
    fetch: Callable[[], T], ok: Callable[[T], bool], what: str, wait_s: float = WAIT_S
) -> T:
    """Fetch until ``ok`` holds for the result; return that result."""
    deadline = time.monotonic() + wait_s
    while True:
        result = fetch()
        if ok(result):
            return result
        assert time.monotonic() < deadline, f"never happened: {what} (last: {result!r})"
        time.sleep(0.01)


def wait_until(condition: Callable[[], bool], what: str, wait_s: float = WAIT_S) -> None:
    """Wait until ``condition()`` holds."""
    wait_for(condition, bool, what, wait_s)
