"""Things that hold threads or sockets and must be closed, usable in ``with``.

The publisher and every transfer backend own a background thread; one base
gives them the same close-on-exit behaviour instead of a copy each.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Closeable(ABC):
    """A resource whose ``close()`` is idempotent; ``with`` closes it on exit."""

    @abstractmethod
    def close(self) -> None:
        """Release the resource; calling it again does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
