"""Connect endpoints' address families, looked up again off the ingest thread.

ZMQ reaches an IPv6 address only from a socket with its IPv6 option, and with it
reaches a name of both families over IPv6 alone; so the sidecar sets it for a
host name that resolves, as its settings are read, to IPv6 addresses and no IPv4
one (``resolved_families``, ``connects_ipv6``). A name that did not resolve then
(a Kubernetes service whose pods were not up yet) was connected over IPv4 for
good, and once it resolved to IPv6 alone ZMQ retried it in silence for ever. So while a
publisher is unheard, its endpoints' names are looked up again every
``RECHECK_S``, and the ingest thread re-makes a socket whose family the answer
changes; so is a replay endpoint's name that has had no address yet, heard or not
(a listen-mode stream is heard on the sidecar's own socket, which says nothing of
its replay endpoint). A lookup may wait on DNS for seconds, which the ingest thread must
not: it runs on a thread of its own, one check at a time, and the ingest
thread takes its answer on a later turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

from offload.wire.endpoint_host import resolved_families
from offload.wire.endpoints import Family

RECHECK_S: Final = 5.0
"""How often the names of unheard publishers' endpoints are looked up again: a publisher
whose service came up is followed within seconds of it. A check waiting on a slow DNS
delays the next, so they never pile up. Fixed, not a setting: a check looks each name up
once, off the ingest thread, and only names that may have changed family."""


class FamilyCheck:
    """Looks endpoints up every ``RECHECK_S``, one check at a time, on a thread of its own;
    the ingest thread polls it."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kvscope-families")
        self._running: Future[dict[str, Family]] | None = None
        self._next = time.monotonic() + RECHECK_S  # the start looked them up already

    def poll(self, endpoints: Callable[[], Iterable[str]]) -> dict[str, Family]:
        """What the check that just ended found: each endpoint whose host resolved, to the
        family ``resolved_families`` found (empty while a check runs, or none ended); and a
        check of ``endpoints()`` started when one is due (called only then)."""
        found: dict[str, Family] = {}
        if self._running is not None:
            if not self._running.done():
                return found
            done, self._running = self._running, None
            found = done.result()
        now = time.monotonic()
        if now >= self._next:
            self._next = now + RECHECK_S
            wanted = set(endpoints())
            if wanted:
                self._running = self._executor.submit(_families, wanted)
        return found

    def close(self) -> None:
        """Start no further check; one waiting on DNS ends on its own, its answer unread."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _families(endpoints: set[str]) -> dict[str, Family]:
    return {e: family for e, family in resolved_families(endpoints).items() if family is not None}
