"""ZMQ endpoints as users write them, checked where they are given.

ZMQ itself refuses a malformed endpoint only when a socket first binds or
connects to it: at start-up that is a traceback from inside ZMQ, and for a
replay endpoint, used only once a gap shows, it was a failure at every later
frame. These patterns accept what ZMQ accepts for the transports that reach
another process (a sidecar never shares a process with its workers, so
``inproc`` is refused too).
"""

from __future__ import annotations

import re
from typing import Final

_HOST: Final = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)"
_BINDABLE: Final = re.compile(rf"tcp://(?:\*|{_HOST}):(?P<port>\*|[0-9]{{1,5}})|ipc://.+")
_CONNECTABLE: Final = re.compile(rf"tcp://{_HOST}:(?P<port>[0-9]{{1,5}})|ipc://.+")


def is_bindable(endpoint: str) -> bool:
    """tcp://HOST:PORT (``*`` for every address, or for a free port) or ipc://PATH."""
    return _fits(_BINDABLE, endpoint, lowest_port=0)


def is_connectable(endpoint: str) -> bool:
    """tcp://HOST:PORT (a host name or address, a port from 1) or ipc://PATH."""
    return _fits(_CONNECTABLE, endpoint, lowest_port=1)


def _fits(pattern: re.Pattern[str], endpoint: str, lowest_port: int) -> bool:
    match = pattern.fullmatch(endpoint)
    if match is None:
        return False
    port = match["port"]
    return port in (None, "*") or lowest_port <= int(port) <= 65535
