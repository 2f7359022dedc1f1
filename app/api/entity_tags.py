"""If-None-Match read as RFC 9110 (13.1.2) writes it, for the page's files (app/api/page.py).

The field is ``*`` or a comma-separated list of entity tags, each a quoted
opaque tag, ``W/`` before it when weak; its field lines join into one list.
A GET is answered 304 when the field is ``*`` (the file exists) or a listed
tag matches the file's by weak comparison (``W/"x"`` matches ``"x"``). The
tag was looked for as a substring of the field instead, so ``*`` got the whole
file and ``"x"junk`` a 304. A tag may hold a comma (``"a,b"`` is one tag), so
the list is scanned tag by tag, never split on commas. A field that is no such
list is read as absent: the whole file is a right answer to any GET, a 304 to
a field the sidecar cannot read would be a guess.
"""

from __future__ import annotations

import re
from typing import Final

_ELEMENT: Final = re.compile(r'[ \t]*+(?:(?:W/)?("[\x21\x23-\x7e\x80-\xff]*+")[ \t]*+)?(?:,|\Z)')
"""One list element and the comma after it (or the field's end): an entity tag, its opaque
tag captured with its quotes, or nothing (RFC 9110 5.6.1 lets a list hold empty elements).
Possessive, so a field of kilobytes of spaces or quotes is scanned once."""


def not_modified(fields: list[str], etag: str) -> bool:
    """Whether If-None-Match's ``fields`` (each field line, in order) match ``etag``, a strong
    tag with its quotes: a GET of the file it tags is then a 304."""
    if not fields:
        return False
    text = ", ".join(fields)
    if text.strip(" \t") == "*":
        return True
    position = 0
    found = False
    while position < len(text):
        element = _ELEMENT.match(text, position)
        if element is None:
            return False  # no list of entity tags: read as absent
        found = found or element[1] == etag
        position = element.end()
    return found
