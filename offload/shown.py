"""Text from outside the program (a file name, a command-line value), fit for one line of a
message: control characters escaped and its length cut.

A file name may hold a newline (a message then forges a second line), a terminal escape
sequence (it recolours or clears the reader's screen) or bytes that are not UTF-8 (a
strict writer then fails); and a value may be megabytes long.
"""

from __future__ import annotations

from typing import Final

MAX_SHOWN: Final = 200
"""Characters of one value shown in a message, before the cut."""


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """``str(value)`` on one printable line, at most ``limit`` characters of it, then '…'."""
    text = str(value)
    cut = text[:limit]
    if not cut.isprintable():
        cut = "".join(
            char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
            for char in cut
        )
    return cut if len(text) <= limit else cut + "…"
