"""A transfer worker's queue: jobs in submission order, expedited ones ahead of the rest.

vLLM marks a load expedited when the engine waits on it within the step (a
request that must have its prefix before it runs): behind a queue of stores or
regular loads, the forward pass would stall for all of them.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

Item = TypeVar("Item")


class JobQueue(Generic[Item]):
    """Unbounded here: the backend's ``JobBook`` caps the jobs that may be queued at all."""

    def __init__(self) -> None:
        self._regular: deque[Item] = deque()
        self._expedited: deque[Item] = deque()
        self._ready = threading.Condition()

    def put(self, item: Item, expedited: bool = False) -> None:
        with self._ready:
            (self._expedited if expedited else self._regular).append(item)
            self._ready.notify()

    def get(self) -> Item:
        """The oldest expedited item, else the oldest other one; waits for one."""
        with self._ready:
            self._ready.wait_for(lambda: self._expedited or self._regular)
            return (self._expedited or self._regular).popleft()
