"""Logging what arrives off the wire without letting the sender write the log.

Malformed frames, bad replay answers and bad replay requests come from peers:
one line per frame let a peer flooding garbage write hundreds of thousands of
lines in seconds (and fill a disk). A ``LogLimiter`` writes the first
occurrence of each kind of problem at once and then at most one line per
``interval_s``, saying how many occurred since the last line. Its lines carry
only what the caller passes, which must be the caller's own text (a publisher
name the operator configured, a stream name made safe to print, a count, an
exception class name), never the peer's bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

DEFAULT_INTERVAL_S: Final = 10.0
"""At most one line per kind of problem this often: a flood costs six lines a minute."""

MAX_KINDS: Final = 1024
"""Most kinds tracked at once; past it, the oldest is forgotten (a key is the caller's text)."""


class LogLimiter:
    """Rate-limited, summarising log lines, one stream of lines per key. Thread-safe."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (when the last line was written, occurrences since then)
        self._kinds: dict[str, tuple[float, int]] = {}

    def log(
        self, level: int, key: str, message: str, *, exc_info: BaseException | None = None
    ) -> bool:
        """Log ``message`` unless a line for ``key`` went out within the interval.

        A line written after a quiet spell says how many occurrences it stands
        for. ``exc_info`` (a traceback) goes only on a line that is written.
        Returns whether a line was written.
        """
        now = self._clock()
        with self._lock:
            last, suppressed = self._kinds.pop(key, (None, 0))
            if last is not None and now - last < self._interval:
                self._kinds[key] = (last, suppressed + 1)
                return False
            self._kinds[key] = (now, 0)
            while len(self._kinds) > MAX_KINDS:
                del self._kinds[next(iter(self._kinds))]
        if suppressed:
            message = f"{message} (and {suppressed} more like it since the last such line)"
        self._logger.log(level, "%s", message, exc_info=exc_info)
        return True
