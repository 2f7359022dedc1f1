"""Keys a mapping holds that its reader does not read, named in one short line.

A misspelt key is otherwise an option silently unset (``num_cpu_blokcs``) or a
field silently missing (``block_hash`` for ``block_hashes``): each unknown key
is named, with the accepted key it is closest to. The keys come from outside
(a config, a request body), so each is shown escaped and cut (offload/shown.py)
and at most ``MAX_NAMED_KEYS`` are named: a mapping of a million keys still
makes one short line.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable
from typing import Final

from offload.shown import shown_repr

MAX_NAMED_KEYS: Final = 5
"""Unknown keys a message names; the rest are counted."""


def unknown_keys(keys: Iterable[object], accepted: Collection[str]) -> str | None:
    """None when every key is accepted; else the unknown ones in order, the first
    ``MAX_NAMED_KEYS`` named (each with the accepted key it is closest to), the rest
    counted."""
    unknown = sorted(str(key) for key in keys if key not in accepted)
    if not unknown:
        return None
    named = []
    for key in unknown[:MAX_NAMED_KEYS]:
        close = difflib.get_close_matches(key, accepted, n=1)
        named.append(shown_repr(key) + (f" (did you mean {close[0]!r}?)" if close else ""))
    if len(unknown) > MAX_NAMED_KEYS:
        named.append(f"and {len(unknown) - MAX_NAMED_KEYS} more")
    return ", ".join(named)
