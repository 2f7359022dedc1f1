"""Text from outside the program (a file name, a command-line value), fit for one line of a
message: control characters escaped and its length cut.

A file name may hold a newline (a message then forges a second line), a terminal escape
sequence (it recolours or clears the reader's screen) or bytes that are not UTF-8 (a
strict writer then fails); and a value may be megabytes long.
"""

from __future__ import annotations

import reprlib
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


class _BoundedRepr(reprlib.Repr):
    """reprlib's repr, cut in length and depth, that describes an integer too long to print.

    ``repr`` of an int past 4,300 digits raises ValueError (so a message holding one
    failed as a different error, naming nothing), and a shorter one may still be
    thousands of characters.
    """

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = MAX_SHOWN

    def repr_int(self, x: int, level: int) -> str:
        return repr(x) if x.bit_length() <= 64 else "<an integer of more than 19 digits>"


_BOUNDED = _BoundedRepr()


def shown_repr(value: object) -> str:
    """``repr(value)`` fit for one line of a message, as ``shown`` makes text fit.

    For a value from a loosely typed config (a string, a number, a nested list), where
    the repr tells ``"8"`` from ``8`` but may be megabytes long or fail to print.
    """
    return shown(_BOUNDED.repr(value))
